"""PeriodicCheckpoint: periodic training checkpoints, written safely, the last K kept; and the resume position.

``TrainingCheckpoint``, this callback's name before 0.2, still works with a DeprecationWarning until 0.3.0: it
was also the name of the checkpoint read back (:class:`trainkit.rundir.checkpoint_file.SavedCheckpoint`)."""
from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Dict, Optional

from mindspore import nn

from trainkit.callbacks.base import Callback
from trainkit.callbacks.steps import last_epoch
from trainkit.rundir.checkpoint_file import (
    Position,
    checkpoint_files,
    config_text,
    make_durable,
    parameter_snapshot,
    save_training_checkpoint,
)
from trainkit.rundir.stateful_parts import StatefulParts

log = logging.getLogger("trainkit")


class PeriodicCheckpoint(Callback):
    """Saves the TrainingWrapper and the run's position at each epoch end and every `every_n_steps` micro-batches.

    Replaces MindSpore's ``ModelCheckpoint``, which deletes its oldest file *before* writing the new one (a crash
    in between leaves fewer checkpoints than promised, none with ``keep_checkpoint_max=1``): here the new file is
    complete on disk before the oldest beyond `keep` is deleted, so the newest good checkpoint always survives.

    The saves it makes itself (epoch ends, every N steps) leave the fsyncs and the pruning to a thread of their own,
    so the steps go on meanwhile (fsync is most of a small model's save: bench row 4); the next save, ``save()`` and
    the end of training wait for them. ``save()`` (a polite stop's, NonFiniteStop's) is durable when it returns.
    Those saves serialise a copy of the values on that thread too, except the last epoch's: no step follows it and
    the end of training waits for the file at once, so it is written from the Parameters themselves (ResNet-50's
    copy is 283 MB, 0.4-0.9 s of page faults on fresh memory).

    Args:
        network: the Cell to save (the TrainingWrapper: weights, optimizer, loss scale, accumulation, EMA).
        directory: where ``trainkit-<epoch>_<step>.ckpt`` files go (created when the first is written).
        steps_per_epoch: micro-batches per epoch (per rank).
        at_epoch_end: save at each epoch end (False: only when :meth:`save` is called, e.g. by NonFiniteStop).
        every_n_steps: also save every N micro-batches; 0: never within an epoch.
        keep: how many of the newest checkpoints to keep (>= 1).
        skipped_steps: returns the run's skipped-step count so far (restored on resume).
        group_size: processes in the data-parallel job (a resume must use as many).
        config: the run's config, stored in each checkpoint so a resume can check it is the same run.
        config_text: ``config`` as YAML (:func:`trainkit.rundir.checkpoint_file.config_text`) where the caller has made
            it already (the app, for ``.hydra/config.yaml``): 11-15 ms a run not spent twice.
        metadata: more entries each checkpoint gets (the data's class names,
            :func:`trainkit.rundir.class_names.checkpoint_entries`).
        parts: the run's stateful parts (:class:`trainkit.rundir.stateful_parts.StatefulParts`), whose state each
            checkpoint appends as it is at the save (early stopping, the records, user callbacks).
    """

    order_role = "training_checkpoint"
    # the epoch's checkpoint holds the outcome of all before it, users' included
    run_after: tuple = ("start_at", "train_metrics", "progress", "nonfinite_stop", "evaluation", "best_checkpoint",
                          "early_stopping", "user")

    def __init__(self, network: nn.Cell, directory: Path, steps_per_epoch: int, *, at_epoch_end: bool = True,
                 every_n_steps: int = 0, keep: int = 3, skipped_steps: Callable[[], int] = lambda: 0,
                 group_size: int = 1, config: Optional[Any] = None, config_text: Optional[str] = None,
                 metadata: Optional[Dict[str, str]] = None, parts: Optional[StatefulParts] = None):
        super().__init__()
        if keep < 1:
            raise ValueError(f"keep must be >= 1; got {keep}")
        self.network = network
        self.directory = Path(directory)
        self.steps_per_epoch = int(steps_per_epoch)
        self.at_epoch_end = bool(at_epoch_end)
        self.every_n_steps = int(every_n_steps)
        self.keep = int(keep)
        self.skipped_steps = skipped_steps
        self.group_size = group_size
        self.config = config
        self.metadata = dict(metadata or {})
        self.parts = parts
        self._config_text = config_text  # the config as YAML; else made at the first save: 15 ms each time
        self.last_saved: Optional[Path] = None
        self._last_saved_step: Optional[int] = None
        self._step = 0
        self._finishing: Optional[Future] = None  # the latest save's fsyncs and pruning, on `_finisher`
        self._finisher: Optional[ThreadPoolExecutor] = None
        self._last_epoch: Optional[int] = None  # the train call's last epoch, known at its first epoch's begin
        self._epoch: Optional[int] = None  # the epoch under way

    def on_train_begin(self, run_context) -> None:
        self._step = int(run_context.original_args().cur_step_num)
        self._last_saved_step = self._step  # the state a resume started from is already on disk
        self._last_epoch = self._epoch = None

    def on_train_epoch_begin(self, run_context) -> None:
        params = run_context.original_args()
        if self._last_epoch is None:
            self._last_epoch = last_epoch(params)
        self._epoch = int(params.cur_epoch_num)

    def on_train_step_begin(self, run_context) -> None:
        self._step = int(run_context.original_args().cur_step_num)  # Model counts the step before this hook

    def on_train_step_end(self, run_context) -> None:
        self._step = int(run_context.original_args().cur_step_num)
        # An epoch's last step is saved at the epoch's end instead, after its evaluation (the callbacks' order):
        # a checkpoint taken before the evaluation is recorded would resume past an evaluation never recorded.
        epoch_end = self.at_epoch_end and self._step % self.steps_per_epoch == 0
        if self.every_n_steps and self._step % self.every_n_steps == 0 and not epoch_end:
            self._save(in_background=True)

    def on_train_epoch_end(self, run_context) -> None:
        self._step = int(run_context.original_args().cur_step_num)
        if self.at_epoch_end:  # the last epoch's values are not copied: no step follows, the train end waits
            self._save(in_background=True, copy=self._last_epoch is None or self._epoch != self._last_epoch)

    def on_train_end(self, run_context) -> None:
        self.wait()
        if self._finisher is not None:  # no idle thread left behind per run (a sweep runs many in one process)
            self._finisher.shutdown()
            self._finisher = None

    def save(self) -> Path:
        """Write a checkpoint of the state after the current step (once per step), then prune beyond `keep`;
        the file is on disk (fsync'ed) when this returns."""
        return self._save(in_background=False)

    def wait(self) -> None:
        """Wait for the latest save's fsyncs and pruning; raises what they raised."""
        finishing, self._finishing = self._finishing, None
        if finishing is not None:
            finishing.result()

    def _save(self, in_background: bool, copy: bool = True) -> Path:
        """Write the checkpoint of the current step; `in_background`: its fsyncs and pruning (and, with `copy`, its
        serialisation, from a copy of the values taken now) on the finisher's thread."""
        if self._last_saved_step == self._step and self.last_saved is not None:
            if not in_background:
                self.wait()
            return self.last_saved
        self.wait()  # the previous file is durable and pruning is done before another is written
        self.directory.mkdir(parents=True, exist_ok=True)
        if self._config_text is None:  # nothing changes the config during a run
            self._config_text = config_text(self.config)
        position = Position(self._step, self.steps_per_epoch)
        path = self.directory / position.file_name()
        values = parameter_snapshot(self.network) if in_background and copy else None
        # the parts' state of this moment, taken now as the values are (a background write goes on after it)
        metadata = {**self.metadata, **(self.parts.checkpoint_entries() if self.parts is not None else {})}

        def write() -> Path:
            return save_training_checkpoint(self.network, path, position, skipped_steps=skipped,
                                            group_size=self.group_size, config_text=self._config_text,
                                            metadata=metadata, durable=False, values=values)

        skipped = self.skipped_steps()
        if values is None:  # a save that must be on disk when it returns (a stop), one MindSpore must read, the last
            write()
        self.last_saved, self._last_saved_step = path, self._step
        if not in_background:
            self._finish(path)
            return path
        if self._finisher is None:
            self._finisher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="trainkit-checkpoint")
        # The values are this step's copy: serialising them (the protobuf, ~10-20 ms a save of the quick start)
        # goes on beside the next steps, as the fsyncs and the pruning already did.
        self._finishing = self._finisher.submit(self._write_and_finish if values is not None else self._finish,
                                                *((write, path) if values is not None else (path,)))
        return path

    def _write_and_finish(self, write: Callable[[], Path], path: Path) -> None:
        write()
        self._finish(path)

    def _finish(self, path: Path) -> None:
        """Make `path` durable, then remove the checkpoints beyond `keep` (never before: one always survives)."""
        make_durable(path)
        self._remove_old(keep_also=path)

    def _remove_old(self, keep_also: Path) -> None:
        files = checkpoint_files(self.directory)
        for path in files[:-self.keep]:
            if path != keep_also:
                try:
                    path.unlink()
                except OSError as error:  # a file another process removed, a read-only folder: not fatal
                    log.warning("could not remove old checkpoint %s: %s", path, error)


class StartAt(Callback):
    """Continues Model's step count from a resumed position (``Model.train`` restarts ``cur_step_num`` at 0).

    Must come first in the callback list, so every other callback sees the run's global step.
    """

    order_role = "start_at"
    run_after: tuple = ()

    def __init__(self, micro_steps: int):
        super().__init__()
        self.micro_steps = int(micro_steps)

    def on_train_begin(self, run_context) -> None:
        run_context.original_args().cur_step_num = self.micro_steps


def __getattr__(name: str):
    if name == "TrainingCheckpoint":
        import warnings

        warnings.warn("trainkit.callbacks.training_checkpoint.TrainingCheckpoint is now PeriodicCheckpoint; the old "
                      "name is removed in 0.3.0", DeprecationWarning, stacklevel=2)
        return PeriodicCheckpoint
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
