"""Read back TensorBoard event files (as tensorboardX writes them) without the tensorboard package.

An event file is a sequence of TFRecords: ``uint64 length, uint32 masked_crc32c(length bytes),
payload, uint32 masked_crc32c(payload)``, little-endian; each payload is a serialized ``Event`` proto.
The CRC-32C (Castagnoli) here is written from its definition, independent of tensorboardX's writer.
"""
from __future__ import annotations

import struct
from pathlib import Path
from typing import Dict, Iterator, List, Tuple, Union

from tensorboardX.proto.event_pb2 import Event


def _crc32c_table() -> List[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def read_events(path: Union[str, Path]) -> Iterator[Event]:
    """Every Event in one event file; raises ValueError on a bad CRC or a truncated record."""
    data = Path(path).read_bytes()
    offset = 0
    while offset < len(data):
        if offset + 12 > len(data):
            raise ValueError(f"{path}: truncated record header at byte {offset}")
        header = data[offset:offset + 8]
        (length,) = struct.unpack("<Q", header)
        (header_crc,) = struct.unpack("<I", data[offset + 8:offset + 12])
        if header_crc != masked_crc32c(header):
            raise ValueError(f"{path}: bad length CRC at byte {offset}")
        start, end = offset + 12, offset + 12 + length
        if end + 4 > len(data):
            raise ValueError(f"{path}: truncated record payload at byte {offset}")
        payload = data[start:end]
        (payload_crc,) = struct.unpack("<I", data[end:end + 4])
        if payload_crc != masked_crc32c(payload):
            raise ValueError(f"{path}: bad payload CRC at byte {offset}")
        event = Event()
        event.ParseFromString(payload)
        yield event
        offset = end + 4


def event_files(log_dir: Union[str, Path], recursive: bool = False) -> List[Path]:
    pattern = "**/events.out.tfevents.*" if recursive else "events.out.tfevents.*"
    return sorted(p for p in Path(log_dir).glob(pattern) if p.is_file())


def read_scalars(log_dir: Union[str, Path], recursive: bool = False) -> Dict[str, List[Tuple[int, float]]]:
    """``{tag: [(step, value), ...]}`` for every scalar in the event files of `log_dir`, in file order.

    Only the files directly in `log_dir` unless `recursive` (tensorboardX's ``add_hparams`` writes
    into a subdirectory, which TensorBoard shows as a separate run).
    """
    scalars: Dict[str, List[Tuple[int, float]]] = {}
    for path in event_files(log_dir, recursive):
        for event in read_events(path):
            if not event.HasField("summary"):
                continue
            for value in event.summary.value:
                if value.HasField("simple_value"):
                    number = float(value.simple_value)
                elif value.HasField("tensor") and value.tensor.float_val:
                    number = float(value.tensor.float_val[0])
                else:
                    continue
                scalars.setdefault(value.tag, []).append((int(event.step), number))
    return scalars


def read_tags(log_dir: Union[str, Path], recursive: bool = False) -> Dict[str, str]:
    """``{tag: plugin name}`` of every summary value (e.g. ``"text"``, ``"hparams"``; ``""`` for plain scalars)."""
    tags: Dict[str, str] = {}
    for path in event_files(log_dir, recursive):
        for event in read_events(path):
            if event.HasField("summary"):
                for value in event.summary.value:
                    tags[value.tag] = value.metadata.plugin_data.plugin_name
    return tags


def read_scalars_as_tensorboard_shows(log_dir: Union[str, Path]) -> Dict[str, List[Tuple[int, float]]]:
    """Like :func:`read_scalars`, with TensorBoard's rule for a restarted run applied: a ``SessionLog.START`` event
    at step s (what ``SummaryWriter(purge_step=s)`` writes) drops every value read before it, from the folder's files
    in name order, at a step >= s (TensorBoard's ``EventAccumulator._Purge``, ``purge_orphaned_data`` on by default).
    """
    scalars: Dict[str, List[Tuple[int, float]]] = {}
    for path in event_files(log_dir):
        for event in read_events(path):
            if event.HasField("session_log") and event.session_log.status == event.session_log.START:
                scalars = {tag: [(step, value) for step, value in values if step < event.step]
                           for tag, values in scalars.items()}
            if not event.HasField("summary"):
                continue
            for value in event.summary.value:
                if value.HasField("simple_value"):
                    scalars.setdefault(value.tag, []).append((int(event.step), float(value.simple_value)))
    return scalars
