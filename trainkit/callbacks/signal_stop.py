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
import math
import os
import signal
import threading
import time
from pathlib import Path
from typing import Callable, Dict, Optional, Tuple

from trainkit.callbacks.base import Callback
from trainkit.callbacks.steps import GlobalStep

log = logging.getLogger("trainkit")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
AGREEMENT_OVERHEAD = 0.01  # data parallel: agree at most this fraction of the training time ...
AGREEMENT_LATENCY = 1.0    # ... and at least every this many seconds of training
_AGREEMENT_BINS = 11       # proposals of 1, 2, 4, ..., 1024 steps


class SignalStop(Callback):
    """Stops training after the step in progress when the process gets SIGTERM or SIGINT; a second signal kills.

    The handlers are installed at ``on_train_begin`` (from the main thread) and the previous ones put back at
    ``on_train_end``. On the first signal the handler records it; the next step end (in data parallel: the next
    step end at which the ranks agree, see `agree`) calls `save_checkpoint` (rank 0) and
    ``run_context.request_stop()``; ``Model`` then ends the epoch early and calls ``on_train_end``. ``stopped``
    says where it stopped. A signal during the run's last step lets the run finish.

    In data parallel, ranks can be a step apart when a signal lands, so they stop only at steps where they all
    take part in `agree`, an all-reduce of their flags. Its cost is that of a collective (measured: ~25 ms on a
    loaded 2-core CPU, against 5 ms for a tiny model's step), so it does not run every step: each agreement also
    settles, from every rank's measured step time and agreement cost, how many steps to the next one -- as many
    as keep its cost under `AGREEMENT_OVERHEAD` of the training time, but at most `AGREEMENT_LATENCY` seconds of
    training apart (at least every step), and at most twice the previous spacing (steps 1, 2, 4, 8, ...: one early
    step time, e.g. of batches prefetched during compilation, does not decide alone); the smallest rank's proposal
    wins. Every rank gets the same number from
    the all-reduce, so they meet. A second signal restores the default action and re-sends the signal to this process:
    it ends at once (exit status 128 + signal in a shell).

    Args:
        save_checkpoint: writes a training checkpoint of the state after the current step and returns its path;
            None (ranks that do not write) saves nothing.
        agree: in data parallel, ``agree(flag, steps) -> (stop, steps)`` all-reduces this rank's "a signal came"
            flag and its proposed number of steps to the next agreement, returning whether any rank's flag is set
            and the agreed number (:func:`agree_over_ranks`); None: decide alone (one process).
    """

    order_role = "signal_stop"
    # its checkpoint is the last thing of a step
    run_after: tuple = ("start_at", "train_metrics", "progress", "nonfinite_stop", "evaluation", "best_checkpoint",
                          "early_stopping", "user", "training_checkpoint")

    def __init__(self, save_checkpoint: Optional[Callable[[], Path]] = None,
                 agree: Optional[Callable[[bool, int], Tuple[bool, int]]] = None):
        super().__init__()
        self.save_checkpoint = save_checkpoint
        self.agree = agree
        self.agreements = 0  # how many times `agree` ran, and the seconds it took in all
        self.agreement_seconds = 0.0
        self._next_agreement: Optional[int] = None
        self._last_agreement: Optional[Tuple[int, float]] = None  # (step, time) of the last one
        self._agreement_seconds: Optional[float] = None
        self._interval = 1  # steps between the last two agreements: the next is at most twice as far
        self.received: Optional[int] = None  # the first signal's number
        self.stopped: Optional[Dict] = None  # {"signal", "step", "epoch", "checkpoint"} once stopped
        self._previous: Dict[int, object] = {}
        self._global_step = GlobalStep()
        self._last_epoch: Optional[int] = None

    # ------------------------------------------------------------------ handlers
    def install(self) -> None:
        """Install the handlers (idempotent); ``Model.train`` calls it through ``on_train_begin``. Python lets only
        the main thread install them: elsewhere (``train`` in a thread) signals keep their default action."""
        if self._previous or threading.current_thread() is not threading.main_thread():
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
        self._next_agreement = self._last_agreement = None
        self._interval = 1
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
        elif self._next_agreement is None or step >= self._next_agreement:
            stop = self._agree(step)
        else:
            return
        last_step = int(params.cur_epoch_num) == self._last_epoch and step % int(params.batch_num) == 0
        if not stop or last_step:  # the run's last step: let it finish (and evaluate) as it would have
            return
        # At an epoch's last step the epoch ends first (its evaluation, best.ckpt, early stopping, the callbacks'
        # epoch hooks): the checkpoint is written after them, at the epoch's end, so it holds their outcome.
        epoch_end = step % int(params.batch_num) == 0
        checkpoint = self.save_checkpoint() if self.save_checkpoint is not None and not epoch_end else None
        self.stopped = {"signal": self.received or signal.SIGTERM, "step": step,
                        "epoch": int(params.cur_epoch_num), "checkpoint": checkpoint}
        if self.received is None:  # another rank got the signal first
            self.received = self.stopped["signal"]
        run_context.request_stop()

    def on_train_epoch_end(self, run_context) -> None:
        if self.stopped is not None and self.stopped["checkpoint"] is None and self.save_checkpoint is not None:
            self.stopped["checkpoint"] = self.save_checkpoint()  # the epoch's own when it wrote one: not again

    def on_train_end(self, run_context) -> None:
        self.uninstall()
        if self.agree is not None and self.agreements:
            log.info("signal check across ranks: %d all-reduce(s), %.0f ms in all (every %d step(s) at the end)",
                     self.agreements, 1000 * self.agreement_seconds,
                     (self._next_agreement or 0) - (self._last_agreement or (0, 0))[0])

    def _agree(self, step: int) -> bool:
        """All-reduce the flag with every rank, and the number of steps to the next agreement."""
        now = time.perf_counter()
        proposal = 1
        if self._last_agreement is not None and self._agreement_seconds is not None and step > self._last_agreement[0]:
            step_seconds = max((now - self._last_agreement[1]) / (step - self._last_agreement[0]), 1e-6)
            by_cost = math.ceil(self._agreement_seconds / (AGREEMENT_OVERHEAD * step_seconds))
            proposal = max(1, min(by_cost, int(AGREEMENT_LATENCY / step_seconds), 2 * self._interval))
        stop, steps = self.agree(self.received is not None, proposal)
        done = time.perf_counter()
        self.agreements += 1
        self._agreement_seconds = done - now
        self.agreement_seconds += done - now
        self._last_agreement = (step, done)
        self._interval = max(1, steps)
        self._next_agreement = step + self._interval
        return stop


def agree_over_ranks(flag: bool, steps: int) -> Tuple[bool, int]:
    """Every rank's `flag` and proposed `steps`, in one all-reduce (every rank waits for all): whether any flag is
    set, and the smallest proposal, rounded down to a power of two (so no rank's latency bound is exceeded) -- the
    same answer on every rank.

    MindSpore's CPU all-reduce only sums, so the proposal travels as a one-hot vector over powers of two: the
    smallest non-zero entry of the sum is the smallest proposal.
    """
    import numpy as np
    from mindspore import Tensor, ops

    sent = np.zeros(1 + _AGREEMENT_BINS, np.float32)
    sent[0] = 1.0 if flag else 0.0
    sent[1 + min(int(math.log2(max(int(steps), 1))), _AGREEMENT_BINS - 1)] = 1.0
    total = ops.AllReduce()(Tensor(sent)).asnumpy()
    return bool(total[0] > 0), 2 ** int(np.flatnonzero(total[1:])[0])

