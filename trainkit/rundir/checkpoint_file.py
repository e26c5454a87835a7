"""The training checkpoint's file: what one holds, how it is written and read back (CRC32, durable, found).

A training checkpoint is ``mindspore.save_checkpoint`` of the TrainingWrapper -- so every Parameter the next
step reads is in it: weights and batch-norm statistics, optimizer moments and ``global_step`` (which indexes the
learning-rate schedule), the loss scale and its counter, ``_grad_sum`` and ``micro_step`` of an open
accumulation window, the EMA shadows and ``ema_num_updates`` -- plus, in MindSpore's ``append_dict``, the
position in the data (micro-batches done), the skipped-step count, the seed and the config it was written with.

Files are ``<directory>/trainkit-<epoch>_<step>.ckpt`` (MindSpore's naming: the epoch in progress, counted from
1, and the step within it). MindSpore writes each to a temporary file and renames it into place; trainkit then
flushes it to disk before deleting older ones, so the newest complete checkpoint always survives a crash.

Every file trainkit writes carries MindSpore's CRC32 of its bytes (``save_checkpoint(..., crc_check=True)``) and
every read checks it (``load_checkpoint(..., crc_check=True)``): a byte changed after the write (a bad disk, a
copy cut short and patched, a hand edit) makes the file corrupt, never silently different. A file written
before trainkit checksummed its checkpoints has no CRC and loads unchecked.

Whether a checkpoint may continue *this* run (the config keys that must stay, the learning rates of the updates
taken) is the app's resume policy: :mod:`trainkit.app.resume_policy`.
"""
from __future__ import annotations

import binascii
import contextlib
import errno
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import mindspore as ms
import numpy as np
from mindspore import nn
from omegaconf import DictConfig, OmegaConf

from trainkit.data.array_batches import DATA_ORDER
from trainkit.data.input_file import check_input, open_input, read_input
from trainkit.errors import CheckpointError, DataError, TrainingError
from trainkit.rundir.kernel_path import ENTRY as KERNEL_PATH
from trainkit.rundir.kernel_path import kernel_path
from trainkit.rundir.stateful_parts import CHECKPOINT_KEY as PARTS_KEY
from trainkit.rundir.stateful_parts import parts_of
from trainkit.rundir.stored_config import read_stored_config

log = logging.getLogger("trainkit")
BEST = "best.ckpt"  # a run's best checkpoint, in its checkpoints/ folder

PREFIX = "trainkit"
_NAME = re.compile(rf"^{PREFIX}-(\d+)_(\d+)\.ckpt$")

# An entry every checksummed file holds: with it, a file whose CRC32 trailer is gone (cut or overwritten) is
# corrupt, not "an older file without a checksum".
CHECKSUMMED = "trainkit_crc32"
_CRC_MARK = b"crc_num"  # MindSpore's trailer: b"crc_num" + the CRC32 of everything before it, 10 bytes big-endian


@dataclass
class Position:
    """Where a checkpoint was written: ``micro_steps`` micro-batches done, ``steps_per_epoch`` per epoch."""

    micro_steps: int
    steps_per_epoch: int

    @property
    def epoch(self) -> int:
        """Whole epochs done."""
        return self.micro_steps // self.steps_per_epoch

    @property
    def step_in_epoch(self) -> int:
        """Micro-batches done in the epoch in progress (0 at an epoch boundary)."""
        return self.micro_steps % self.steps_per_epoch

    def file_name(self) -> str:
        """``trainkit-<epoch in progress>_<step in it>.ckpt``; an epoch's end is ``trainkit-<epoch>_<steps>``."""
        epoch, step = divmod(self.micro_steps, self.steps_per_epoch)
        if step == 0 and epoch > 0:
            epoch, step = epoch - 1, self.steps_per_epoch
        return f"{PREFIX}-{epoch + 1}_{step}.ckpt"


#: What trainkit appends to a training checkpoint besides Parameters (:func:`save_training_checkpoint` and its
#: metadata: the class names, the data state, the training order), none of them the network's.
#: The entry holding the run's config (resolved YAML): in every training checkpoint and in best.ckpt.
CONFIG_ENTRY = "trainkit_config"
APPENDED = ("micro_steps", "steps_per_epoch", "skipped_steps", "group_size", CONFIG_ENTRY, KERNEL_PATH,
            "trainkit_class_names", "trainkit_data_state", DATA_ORDER, PARTS_KEY)


@dataclass
class SavedCheckpoint:
    """A checkpoint read back: its file, its Parameters and what trainkit appended."""

    path: Path
    parameters: Dict[str, ms.Parameter]
    position: Position
    skipped_steps: int
    group_size: int
    config: Optional[DictConfig]
    kernel_path: Optional[str] = None  # "fused" or "mindspore" (trainkit.rundir.kernel_path), None: no fused pass
    data_order: Optional[str] = None  # how the training order was drawn (trainkit.data.array_batches.DATA_ORDER)
    parts: Optional[Dict[str, Any]] = None  # the stateful parts' state (trainkit.rundir.stateful_parts); None: older


def config_text(config: Optional[DictConfig]) -> Optional[str]:
    """The run's config as a checkpoint stores it (resolved YAML), or None without one."""
    return None if config is None else OmegaConf.to_yaml(config, resolve=True)


def save_training_checkpoint(wrapper: nn.Cell, path: Path, position: Position, *, skipped_steps: int,
                             group_size: int, config_text: Optional[str],
                             metadata: Optional[Dict[str, str]] = None, durable: bool = True,
                             values: Optional[List[dict]] = None) -> Path:
    """Write `wrapper` and the run's position to `path`, durably (renamed into place, then fsync'ed).

    `config_text` is :func:`config_text` of the run's config (made once per run: it costs more than the save of
    a small model), or None. `metadata`: more entries to append (the class names:
    :func:`trainkit.rundir.class_names.checkpoint_entries`). `durable=False` leaves the fsyncs to the caller
    (:func:`make_durable`, e.g. on another thread): the file is complete and in place when this returns.
    `values`: :func:`parameter_snapshot` of `wrapper`, taken earlier, written instead of its Parameters' values
    now (a save on another thread while training goes on).
    """
    append = {
        "micro_steps": int(position.micro_steps),
        "steps_per_epoch": int(position.steps_per_epoch),
        "skipped_steps": int(skipped_steps),
        "group_size": int(group_size),
    }
    if config_text is not None:
        append["trainkit_config"] = config_text
    kernels = kernel_path(wrapper)
    if kernels is not None:
        append[KERNEL_PATH] = kernels
    append.update(metadata or {})
    path = Path(path)
    with nothing_partial_left(path, "the earlier checkpoints are intact"):
        save_checksummed(wrapper if values is None else values, path, append)  # written as <name>.tmp, renamed
    if durable:
        make_durable(path)
    return path


def parameter_snapshot(wrapper: nn.Cell) -> Optional[List[dict]]:
    """What ``mindspore.save_checkpoint(wrapper)`` would write, copied now (``[{"name", "data"}]``, the order and
    names it uses): a save from it on another thread holds the values of this moment while training moves on.
    None where MindSpore's own save must read the Cell (model parallel layouts, bfloat16 that NumPy cannot copy)."""
    from mindspore.parallel._utils import _is_in_auto_parallel_mode

    if _is_in_auto_parallel_mode():
        return None
    chosen: Dict[str, object] = {}
    for _, parameter in wrapper.parameters_and_names():
        if parameter.dtype == ms.bfloat16 or parameter.cache_enable:
            return None
        chosen.setdefault(parameter.name, parameter)
    if any(parameter.has_init for parameter in chosen.values()):  # 0.3 ms a call on the quick start otherwise
        wrapper.init_parameters_data()
    return [{"name": name, "data": ms.Tensor.from_numpy(parameter.asnumpy().copy())}  # the copy is the Tensor's
            for name, parameter in chosen.items()]


def make_durable(path: Path) -> None:
    """fsync a file that was renamed into place, then its folder (the rename): it survives a power loss."""
    _fsync(path)
    _fsync(path.parent)


def save_checksummed(network, path: Path, append_dict: Optional[Dict[str, object]] = None) -> None:
    """``mindspore.save_checkpoint`` with its CRC32 (checked by every :func:`load_checkpoint_file`)."""
    ms.save_checkpoint(network, str(path), append_dict={**(append_dict or {}), CHECKSUMMED: 1}, crc_check=True)


def checkpoint_crc(path: Path) -> Optional[int]:
    """The CRC32 MindSpore stored at the end of checkpoint `path` (None without one): names one exact file."""
    with open_input(path, CheckpointError, f"checkpoint {path}") as stream:
        stream.seek(0, os.SEEK_END)
        if stream.tell() < len(_CRC_MARK) + 10:
            return None
        stream.seek(-(len(_CRC_MARK) + 10), os.SEEK_END)
        tail = stream.read()
    return int.from_bytes(tail[len(_CRC_MARK):], "big") if tail.startswith(_CRC_MARK) else None


def checkpoint_files(directory: Path) -> List[Path]:
    """The training checkpoints in `directory`, oldest first (by the epoch and step in their names)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = []
    for path in directory.iterdir():
        match = _NAME.match(path.name)
        if match and path.is_file():
            found.append(((int(match.group(1)), int(match.group(2))), path))
    return [path for _, path in sorted(found)]


def find_checkpoint(path: Path, which: str = "best") -> Path:
    """The checkpoint `path` names: the file itself, or a run directory's best (or newest) checkpoint."""
    if path.is_file() or (path.exists() and not path.is_dir()):  # a FIFO, a device: the read says what it is
        return path
    if not path.exists():
        raise CheckpointError(f"{path} does not exist")
    folder = path / "checkpoints" if (path / "checkpoints").is_dir() else path
    if which == "best" and (folder / BEST).is_file():
        return folder / BEST
    files = checkpoint_files(folder)
    if not files:
        raise CheckpointError(f"{path} holds no checkpoint ({BEST} or trainkit-<epoch>_<step>.ckpt in "
                              f"{folder}): pass a run directory or a checkpoint file")
    if which == "best":
        log.info("%s has no %s: using the newest checkpoint, %s", folder, BEST, files[-1].name)
    return files[-1]


def load_checkpoint_file(path: Path) -> Dict[str, ms.Parameter]:
    """``mindspore.load_checkpoint`` with a CheckpointError naming the file when it is missing or corrupt."""
    path = Path(path)
    check_input(path, CheckpointError, f"checkpoint {path}")  # MindSpore opens it itself: a FIFO would hang it
    try:
        with _mindspore_log_muted():  # its "[ERROR] ... may not have permission" would precede trainkit's reason
            saved = ms.load_checkpoint(str(path), crc_check=True)
    except (ValueError, RuntimeError, OSError, TypeError) as error:
        if _fails_its_crc(path):
            raise CheckpointError(f"checkpoint {path} is corrupt: it fails its CRC32 checksum (its bytes changed "
                                  "after it was written)") from error
        raise CheckpointError(f"checkpoint {path} cannot be read: it is corrupt or not a MindSpore checkpoint: "
                              f"{str(error).splitlines()[0] if str(error) else type(error).__name__}") from error
    if not saved:
        raise CheckpointError(f"checkpoint {path} holds no parameters")
    if CHECKSUMMED in saved:
        saved.pop(CHECKSUMMED)
        if checkpoint_crc(path) is None:
            raise CheckpointError(f"checkpoint {path} is corrupt: it was written with a CRC32 checksum and its "
                                  "checksum is gone (the end of the file changed)")
    return saved


@contextlib.contextmanager
def _mindspore_log_muted():
    """MindSpore's Python logger off for one call whose failure trainkit reports itself, in one line."""
    try:
        from mindspore import log as ms_log

        logger = ms_log._get_logger()
    except Exception:  # noqa: BLE001 -- a private API: without it the message is only noisier
        yield
        return
    disabled, logger.disabled = logger.disabled, True
    try:
        yield
    finally:
        logger.disabled = disabled


def _fails_its_crc(path: Path) -> bool:
    """Whether `path` has a CRC32 trailer that its bytes do not match."""
    content = read_input(path, error=CheckpointError, name=f"checkpoint {path}")
    stored = checkpoint_crc(path)
    return stored is not None and binascii.crc32(content[:-(len(_CRC_MARK) + 10)]) != stored


def read_training_checkpoint(path: Path) -> SavedCheckpoint:
    """Load a training checkpoint; CheckpointError naming the file when it is missing, corrupt or not trainkit's."""
    path = Path(path)
    parameters = load_checkpoint_file(path)
    missing = [key for key in ("micro_steps", "steps_per_epoch") if key not in parameters]
    if missing:
        raise CheckpointError(f"checkpoint {path} is not a trainkit training checkpoint (no {', '.join(missing)}): "
                        "resume needs a file written by a trainkit run (checkpoints/trainkit-<epoch>_<step>.ckpt)")
    extra = {key: parameters.pop(key) for key in APPENDED if key in parameters}
    config = _stored_config(extra.get(CONFIG_ENTRY), path)
    return SavedCheckpoint(
        path=path, parameters=parameters,
        position=Position(int(_scalar(extra["micro_steps"])), int(_scalar(extra["steps_per_epoch"]))),
        skipped_steps=int(_scalar(extra.get("skipped_steps", 0))),
        group_size=int(_scalar(extra.get("group_size", 1))), config=config,
        kernel_path=str(_scalar(extra[KERNEL_PATH])) if KERNEL_PATH in extra else None,
        data_order=str(_scalar(extra[DATA_ORDER])) if DATA_ORDER in extra else None,
        parts=parts_of(extra, f"checkpoint {path}"))


def _stored_config(text: Any, path: Path) -> Optional[DictConfig]:
    """The config a checkpoint's :data:`CONFIG_ENTRY` holds, read as data (None without one); a ConfigError, not a
    CheckpointError, when it holds more than data: never read past as "a file without a config"."""
    if text is None:
        return None
    return read_stored_config(str(_scalar(text)), f"the config stored in checkpoint {path}")


def stored_config(path: Path) -> Optional[DictConfig]:
    """The run's config that any checkpoint trainkit wrote holds (a training checkpoint or ``best.ckpt``), or None
    for a file without one (exported, converted, or written before ``best.ckpt`` stored it)."""
    path = Path(path)
    return _stored_config(load_checkpoint_file(path).get(CONFIG_ENTRY), path)


def read_resumable_checkpoint(path: Path) -> SavedCheckpoint:
    """:func:`read_training_checkpoint`, refusing a state no run can continue from: a non-finite float Parameter.

    The non-finite guard skips a step whose update is not finite, so a run never saves such a state (unless it ran
    with the guard off and diverged); one found here was damaged after the write, or by a run without the guard.
    """
    checkpoint = read_training_checkpoint(path)
    for name, value in checkpoint.parameters.items():
        array = value.asnumpy() if hasattr(value, "asnumpy") else None
        if array is not None and array.dtype.kind == "f" and not np.isfinite(array).all():
            raise CheckpointError(f"checkpoint {checkpoint.path} holds non-finite values ({name}: "
                                  f"{int(np.size(array) - np.isfinite(array).sum())} of {np.size(array)}): no run "
                                  "can continue from it, and with the non-finite guard (wrapper.skip_nonfinite, the "
                                  "default) no run saves one, so the file is damaged; resume from an earlier "
                                  "checkpoint")
    return checkpoint


def newest_valid_checkpoint(directory: Path) -> Optional[SavedCheckpoint]:
    """The newest checkpoint in `directory` that loads, passes its CRC32 and is finite; the others are skipped
    with a warning naming them."""
    for path in reversed(checkpoint_files(directory)):
        try:
            return read_resumable_checkpoint(path)
        except DataError as error:
            log.warning("trainer.resume=auto: skipping %s", error)
    return None


def find_resume_checkpoint(resume: str, run_dir: Path) -> Optional[SavedCheckpoint]:
    """``trainer.resume``: ``auto`` (the newest valid checkpoint of the run directory, or None) or a path.

    A path may name a checkpoint file, a ``checkpoints`` folder or a run directory (its ``checkpoints``).
    """
    if resume == "auto":
        return newest_valid_checkpoint(run_dir / "checkpoints")
    path = Path(resume).expanduser()
    if path.is_dir():
        folder = path / "checkpoints" if (path / "checkpoints").is_dir() else path
        if not checkpoint_files(folder):
            raise DataError(f"trainer.resume={resume}: {folder} holds no trainkit-<epoch>_<step>.ckpt checkpoint")
        found = newest_valid_checkpoint(folder)
        if found is None:
            raise DataError(f"trainer.resume={resume}: no checkpoint in {folder} loads (see the warnings above)")
        return found
    return read_resumable_checkpoint(path)


def _scalar(value):
    """append_dict values come back as Parameters (numbers) or str."""
    if isinstance(value, (str, int, float)):
        return value
    array = value.asnumpy() if hasattr(value, "asnumpy") else value
    return array.item() if hasattr(array, "item") else array


@contextlib.contextmanager
def nothing_partial_left(path: Path, intact: str, named: Optional[Path] = None) -> Iterator[None]:
    """Around a ``mindspore.save_checkpoint`` to `path` (which writes ``<stem>.tmp``, then renames it): a failure
    removes that temporary file, and a full disk (or quota) becomes one ``TrainingError`` naming the checkpoint
    (`named`, default `path`) and saying what is `intact`, instead of a crash's traceback."""
    try:
        yield
    except BaseException as error:
        _remove_partial(path.with_suffix(".tmp"))
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
            full = TrainingError(f"checkpoint {named or path} could not be written: the disk is full "
                                 f"({error.strerror}); nothing partial was left and {intact}: free some space, then "
                                 "continue with trainer.resume=auto")
            log.error("%s", full)
            raise full from error
        raise


def _remove_partial(path: Path) -> None:
    """A save that failed leaves MindSpore's temporary file: remove it (best effort; it is never read)."""
    with contextlib.suppress(OSError):  # a folder gone read-only: the save's own error is the one to report
        path.unlink()


def _fsync(path: Path) -> None:
    """Flush a file or folder to disk (best effort where the platform has no folder fsync)."""
    try:
        descriptor = os.open(str(path), os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)
