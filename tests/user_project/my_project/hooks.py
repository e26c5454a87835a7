"""A user's callback: appends the epoch and the rank to a file at each epoch end."""
from mindspore.train import Callback

from trainkit.distributed import current_setup


class EpochLog(Callback):
    def __init__(self, path: str, every: int = 1):
        super().__init__()
        self.path, self.every = path, every

    def on_train_epoch_end(self, run_context):
        epoch = run_context.original_args().cur_epoch_num
        setup = current_setup()
        if epoch % self.every == 0:
            with open(self.path, "a", encoding="utf-8") as file:
                file.write(f"epoch {epoch} rank {setup.rank} writer {setup.writer}\n")
