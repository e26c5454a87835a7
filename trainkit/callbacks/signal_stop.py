"""SignalStop: SIGTERM or SIGINT (Ctrl-C) ends a run politely, after the step in progress, with a checkpoint there.

Schedulers (SLURM, Kubernetes, spot instances) send SIGTERM and wait a grace period before SIGKILL; Ctrl-C sends
SIGINT. Without this, either ends a run at once: no checkpoint at the stopping point, no line saying so.

MindSpore's own ``mindspore.train.OnRequestExit`` does not fit trainkit: it acts only with the environment variable
``MS_ENABLE_GRACEFUL_EXIT=1`` on networks that hold MindSpore's ``graceful_exit``/``graceful_init`` Parameters (its
own training cells), handles SIGTERM only, and saves a checkpoint of its own format and name that a trainkit resume
cannot continue from. This callback works with any train network: the handler only sets a flag; the step end that
sees it asks ``Model`` to stop (``run_context.request_stop()``) after the checkpoint callback's ``save()``.
"""
from __future__ import annotations

import logging
import os
import signal
from pathlib import Path
from typing import Callable, Dict, Optional

from mindspore.train import Callback

from trainkit.callbacks.train_metrics import GlobalStep

log = logging.getLogger("trainkit")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class SignalStop(Callback):
    """Stops training after the step in progress when the process gets SIGTERM or SIGINT; a second signal kills.

    The handlers are installed at ``on_train_begin`` (from the main thread) and the previous ones put back at
    ``on_train_end``. On the first signal the handler records it; the next step end (in data parallel: the next
    step end at which the ranks agree, see `agree`) calls `save_checkpoint` (rank 0) and
    ``run_context.request_stop()``; ``Model`` then ends the epoch early and calls ``on_train_end``. ``stopped``
    says where it stopped. A signal during the run's last step lets the run finish. A second signal restores the default action and re-sends the signal to this process:
    it ends at once (exit status 128 + signal in a shell).

    Args:
        save_checkpoint: writes a training checkpoint of the state after the current step and returns its path;
            None (ranks that do not write) saves nothing.
        agree: in data parallel, ``agree(flag) -> bool`` all-reduces this rank's "a signal came" flag so every rank
            stops after the same step; None: decide alone (one process).
        agree_every_n_steps: how often `agree` runs (a collective each time; see DEVELOPERS.md for its cost).
    """

    def __init__(self, save_checkpoint: Optional[Callable[[], Path]] = None,
                 agree: Optional[Callable[[bool], bool]] = None, agree_every_n_steps: int = 1):
        super().__init__()
        if not isinstance(agree_every_n_steps, int) or agree_every_n_steps < 1:
            raise ValueError(f"agree_every_n_steps must be an int >= 1; got {agree_every_n_steps!r}")
        self.save_checkpoint = save_checkpoint
        self.agree = agree
        self.agree_every_n_steps = agree_every_n_steps
        self.received: Optional[int] = None  # the first signal's number
        self.stopped: Optional[Dict] = None  # {"signal", "step", "epoch", "checkpoint"} once stopped
        self._previous: Dict[int, object] = {}
        self._global_step = GlobalStep()
        self._last_epoch: Optional[int] = None

    # ------------------------------------------------------------------ handlers
    def install(self) -> None:
        """Install the handlers (idempotent); ``Model.train`` calls it through ``on_train_begin``."""
        if self._previous:
            return
        for signum in STOP_SIGNALS:
            self._previous[signum] = signal.signal(signum, self._handle)

    def uninstall(self) -> None:
        """Put the previous handlers back."""
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def _handle(self, signum, frame) -> None:
        if self.received is not None:  # the second signal: stop now, as if nothing were installed
            self.uninstall()
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        self.received = signum
        log.warning("%s received: stopping after the current step with a checkpoint there (send it again to "
                    "stop at once)", signal.Signals(signum).name)

    # ------------------------------------------------------------------ hooks
    def on_train_begin(self, run_context) -> None:
        self._global_step.reset()
        self._last_epoch = None
        self.install()

    def on_train_epoch_begin(self, run_context) -> None:
        params = run_context.original_args()
        self._global_step(params)  # fixes the step offset of a resumed run
        if self._last_epoch is None:  # epochs run from initial_epoch + 1 to initial_epoch + epoch_num
            self._last_epoch = int(params.cur_epoch_num) - 1 + int(params.epoch_num)

    def on_train_step_end(self, run_context) -> None:
        params = run_context.original_args()
        step = self._global_step(params)
        if self.agree is None:
            stop = self.received is not None
        elif step % self.agree_every_n_steps == 0:
            stop = self.agree(self.received is not None)
        else:
            return
        last_step = int(params.cur_epoch_num) == self._last_epoch and step % int(params.batch_num) == 0
        if not stop or last_step:  # the run's last step: let it finish (and evaluate) as it would have
            return
        checkpoint = self.save_checkpoint() if self.save_checkpoint is not None else None
        self.stopped = {"signal": self.received or signal.SIGTERM, "step": step,
                        "epoch": int(params.cur_epoch_num), "checkpoint": checkpoint}
        if self.received is None:  # another rank got the signal first
            self.received = self.stopped["signal"]
        run_context.request_stop()

    def on_train_end(self, run_context) -> None:
        self.uninstall()


def any_rank(flag: bool) -> bool:
    """Whether `flag` is set on any rank of the data-parallel job (a one-element all-reduce; every rank waits)."""
    import mindspore as ms
    from mindspore import Tensor, ops

    total = ops.AllReduce()(Tensor([1.0 if flag else 0.0], ms.float32))
    return bool(total.asnumpy()[0] > 0)


def continue_command(run_dir: Path) -> str:
    """The command that continues this run: this command's overrides, its run directory and ``trainer.resume=auto``.

    Outside ``python -m trainkit`` (``train(cfg)`` in-process) there is no command line to repeat: the answer says
    what to change in the config instead.
    """
    import shlex
    import sys

    from hydra.core.hydra_config import HydraConfig

    from trainkit.launch import command_flags, forwarded_hydra_overrides

    if not HydraConfig.initialized():
        return f"train(cfg) again with trainer.resume=auto and run_dir={run_dir}"
    hydra_cfg = HydraConfig.get()
    task = [o for o in hydra_cfg.overrides.task if not o.lstrip("+~").startswith("trainer.resume=")]
    words = ["python", "-m", "trainkit", *command_flags(sys.argv[1:]), *task,
             *forwarded_hydra_overrides(hydra_cfg.overrides.hydra), f"hydra.run.dir={run_dir}", "trainer.resume=auto"]
    return " ".join(shlex.quote(word) for word in words)
