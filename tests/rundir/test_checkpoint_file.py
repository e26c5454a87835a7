"""A damaged checkpoint is reported by trainkit in one line: MindSpore's own misleading log line stays quiet."""
import os
import subprocess
import sys

import mindspore as ms
import numpy as np
from mindspore import nn

from trainkit.rundir.checkpoint_file import load_checkpoint_file, save_checksummed


def test_flipped_bytes_fail_the_crc_in_one_line_without_mindspores_log(tmp_path):
    path = tmp_path / "net.ckpt"
    save_checksummed(nn.Dense(64, 64), path)
    content = bytearray(path.read_bytes())
    middle = len(content) // 2
    content[middle:middle + 100] = bytes(b ^ 0xFF for b in content[middle:middle + 100])
    path.write_bytes(bytes(content))
    # a fresh process: MindSpore's log handler holds the stderr of the moment it was made, which pytest replaces
    code = ("from trainkit.rundir.checkpoint_file import load_checkpoint_file\n"
            "from trainkit.errors import CheckpointError\n"
            f"try:\n    load_checkpoint_file({str(path)!r})\nexcept CheckpointError as error:\n    print(error)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env={**os.environ, "GLOG_v": "3"})
    assert "fails its CRC32 checksum" in result.stdout, result.stdout + result.stderr
    assert "Failed to read the checkpoint" not in result.stdout + result.stderr


def test_an_intact_checkpoint_loads_its_values(tmp_path):
    dense = nn.Dense(3, 2)
    path = tmp_path / "net.ckpt"
    save_checksummed(dense, path)
    saved = load_checkpoint_file(path)
    np.testing.assert_array_equal(saved["weight"].asnumpy(), dense.weight.asnumpy())
    assert isinstance(saved["bias"], ms.Parameter)
