"""How a run ends other than by running out of epochs, and what that means for its record and for a resume.

* a signal (SIGTERM, SIGINT): :class:`~trainkit.callbacks.signal_stop.SignalStop` stops after the step in progress
  with a checkpoint there; :func:`raise_if_interrupted` then ends ``train`` with ``RunInterrupted`` (exit status
  128 + signal from ``python -m trainkit``) and the command that continues the run;
* early stopping (``trainer.early_stopping``): :class:`~trainkit.callbacks.early_stopping.EarlyStopping` ends a
  run whose evaluations stopped improving and marks it finished (:func:`check_not_finished_early`);
* continuing (``trainer.resume``): :func:`run_log_start` is where the records after the checkpoint leave the main
  record, since the continuation writes them again.

The app calls these in a few lines; the logic lives here and in the callbacks.
"""
from __future__ import annotations

import logging
import signal
from pathlib import Path
from typing import Any, Dict, List, Optional

from trainkit.app.plan import RunPlan
from trainkit.callbacks.base import Callback
from trainkit.callbacks.early_stopping import EarlyStopping, read_marker
from trainkit.callbacks.signal_stop import SignalStop, agree_over_ranks
from trainkit.errors import ConfigError, RunInterrupted
from trainkit.rundir.command import continue_command

log = logging.getLogger("trainkit")


def continues_at(resumed: Any, run_dir: Path, continuing: bool = False) -> Optional[int]:
    """The step a resumed run continues this run directory's record from; None for a new record.

    A checkpoint of this run directory continues its record; one from elsewhere starts a new record here. A run
    `continuing` this directory without a checkpoint (``trainer.resume=auto`` found none: the earlier attempt died
    before its first, or every one was damaged) starts the record again: -1, so everything the earlier attempt
    recorded (step 0 included) is superseded, as a resume would supersede what came after its checkpoint.
    """
    if resumed is None:
        return -1 if continuing else None
    if Path(resumed.path).parent != Path(run_dir) / "checkpoints":
        return None
    return int(resumed.position.micro_steps)


def stop_callbacks(plan: RunPlan, evaluation: Any, checkpointer: Any) -> List[Callback]:
    """SignalStop (always) and EarlyStopping (with ``trainer.early_stopping.metric``); each declares what it runs
    after: SignalStop after the checkpoint callback, EarlyStopping after Evaluation and BestCheckpoint."""
    save = checkpointer.save if checkpointer is not None else None
    callbacks: List[Callback] = [SignalStop(save, agree=agree_over_ranks if plan.group_size > 1 else None)]
    early = plan.early_stopping
    if early is not None:
        callbacks.append(EarlyStopping(evaluation, early.metric, mode=early.mode, patience=early.patience,
                                       min_delta=early.min_delta,
                                       marker_directory=plan.checkpoints if plan.writer else None))
    return callbacks


def check_not_finished_early(checkpoint: Any, run_dir: Path) -> None:
    """A run that early stopping ended is finished: refuse to continue it from its last checkpoint."""
    folder = Path(checkpoint.path).parent
    marker = read_marker(folder)
    if marker is None or int(marker.get("step") or 0) > checkpoint.position.micro_steps:
        return
    raise ConfigError(f"the run in {folder.parent} was stopped early after epoch {marker.get('epoch')} "
                      f"({marker.get('metric')} did not improve for {marker.get('patience')} evaluation(s); best "
                      f"{marker.get('best')} at epoch {marker.get('best_epoch')}): it is finished, nothing is left to "
                      f"train; its best weights are in {folder / 'best.ckpt'}. To train on anyway, resume from "
                      f"{checkpoint.path} with trainer.early_stopping.metric=null or a larger patience after moving "
                      f"{folder / 'early_stopped.json'} away")


def stop_metrics(callbacks: List[Callback]) -> Dict[str, float]:
    """Final metrics of an early-stopped run: the best epoch and value, and the epoch it stopped after."""
    for callback in callbacks:
        if isinstance(callback, EarlyStopping) and callback.best_epoch is not None:
            metrics = {"best_epoch": float(callback.best_epoch), f"best_{callback.metric.replace('/', '_')}":
                       float(callback.best)}
            if callback.stopped is not None:
                metrics["stopped_epoch"] = float(callback.stopped["epoch"])
            return metrics
    return {}


def raise_if_interrupted(callbacks: List[Callback], run_dir: Path, steps_per_epoch: int) -> None:
    """After ``Model.train``: when a signal stopped it, log where and how to continue, raise RunInterrupted."""
    stop: Optional[SignalStop] = next((c for c in callbacks if isinstance(c, SignalStop)), None)
    if stop is None or stop.stopped is None:
        if stop is not None and stop.received is not None:
            log.info("%s came after the last step: the run is finished", signal.Signals(stop.received).name)
        return
    where = stop.stopped
    epoch, in_epoch = divmod(where["step"], steps_per_epoch)
    if in_epoch == 0:
        epoch, in_epoch = epoch - 1, steps_per_epoch
    name = signal.Signals(where["signal"]).name
    saved = f"checkpoint {where['checkpoint']}" if where["checkpoint"] else "no checkpoint (this rank writes none)"
    message = (f"stopped by {name} after step {where['step']} (epoch {epoch + 1}, step {in_epoch} of "
               f"{steps_per_epoch} in it): {saved}; continue with: {continue_command(run_dir)}")
    log.warning("%s", message)
    if stop.agree is not None:  # every rank waits here until rank 0 has written all of the above, since msrun
        stop.agree(True, 1)     # kills the other workers as soon as one of them exits (128 + signal is not 0)
    raise RunInterrupted(message, where["signal"])

