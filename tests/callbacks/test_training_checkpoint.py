"""An epoch's last step is checkpointed after the epoch's evaluation, never before it: a run killed between the two
must resume from the checkpoint before, redo the epoch's end and record its evaluation (a checkpoint at the epoch's
last step taken first resumed past an evaluation never recorded: seen once in four suite runs)."""
from pathlib import Path
from types import SimpleNamespace

from trainkit.callbacks.training_checkpoint import TrainingCheckpoint


class Recorder(TrainingCheckpoint):
    def __init__(self, **kwargs):
        super().__init__(network=None, directory="unused", steps_per_epoch=5, **kwargs)
        self.saved_at = []

    def save(self):
        self.saved_at.append(self._step)


def context(step):
    args = SimpleNamespace(cur_step_num=step)
    return SimpleNamespace(original_args=lambda: args)


def run(checkpoint, steps=10):
    events = []
    for step in range(1, steps + 1):
        checkpoint.on_train_step_end(context(step))
        events += [("step end", s) for s in checkpoint.saved_at]
        checkpoint.saved_at.clear()
        if step % 5 == 0:
            checkpoint.on_train_epoch_end(context(step))
            events += [("epoch end", s) for s in checkpoint.saved_at]
            checkpoint.saved_at.clear()
    return events


def test_every_n_steps_leaves_an_epochs_last_step_to_the_epoch_end():
    assert run(Recorder(every_n_steps=5)) == [("epoch end", 5), ("epoch end", 10)]
    assert run(Recorder(every_n_steps=3)) == [("step end", 3), ("epoch end", 5), ("step end", 6), ("step end", 9),
                                              ("epoch end", 10)]


def test_without_epoch_end_saves_every_n_steps_saves_at_the_step():
    assert run(Recorder(every_n_steps=5, at_epoch_end=False)) == [("step end", 5), ("step end", 10)]


def test_the_app_checkpoints_after_the_evaluation_and_best_ckpt():
    from trainkit.app import build

    source = Path(build.__file__).read_text()
    body = source[source.index("def build_callbacks"):]
    assert body.index("callbacks.append(evaluation)") < body.index("callbacks.append(BestCheckpoint") \
        < body.index("callbacks.append(checkpointer)")
