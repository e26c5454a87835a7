"""The vision user's path as docs/coming-from-pytorch.md and docs/your-data.md write it, each step a command of its
own: port a timm model (no trick of the user's: trainkit imports torchvision's operators itself), fine-tune it from
its ported weights on a folder of images with data.augment=randaugment, export the run to ONNX (checked by trainkit
before it is kept) and serve the file with onnxruntime."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.common.image_folders import write_folder

ROOT = Path(__file__).resolve().parents[2]


def run(command, cwd):
    environment = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{cwd}", "GLOG_v": "3"}
    done = subprocess.run([sys.executable, "-m", *command], capture_output=True, text=True, env=environment,
                          cwd=cwd, timeout=900)
    assert done.returncode == 0, (command, done.stderr[-3000:])
    return done


# about 25 s: a port, a training run and an export, each a process (the documented path, run as written)
def test_port_a_timm_model_train_it_on_an_image_folder_with_randaugment_export_onnx_and_serve_it(tmp_path):
    pytest.importorskip("torch")
    onnxruntime = pytest.importorskip("onnxruntime")
    import importlib.util

    if importlib.util.find_spec("timm") is None:
        pytest.skip("timm is not installed")
    run(["trainkit.port", "timm:create_model", "--arg", "model_name=mobilenetv3_small_050", "--arg", "num_classes=3",
         "--out", "mnv3", "--input-shape", "3,32,32"], tmp_path)
    write_folder(tmp_path / "images", {"circle": 12, "square": 12, "star": 12}, size=(32, 32))
    run(["trainkit", "hydra.searchpath=[file://mnv3/conf]", "model=mnv3", "model.pretrained=mnv3/weights.ckpt",
         "data=image_folder", "data.root=images", "data.image_size=32", "data.batch_size=4",
         "data.augment=randaugment", "data.num_parallel_workers=1", "trainer.epochs=1", "trainer.test=false",
         "logger.progress=off", "hydra.run.dir=runs/mnv3"], tmp_path)
    exported = run(["trainkit.export", "runs/mnv3", "mnv3.onnx", "--trust", "mnv3"], tmp_path)
    assert (tmp_path / "mnv3.onnx").is_file(), exported.stdout
    session = onnxruntime.InferenceSession(str(tmp_path / "mnv3.onnx"), providers=["CPUExecutionProvider"])
    (feed,) = session.get_inputs()
    assert list(feed.shape)[1:] == [3, 32, 32]
    batch = np.random.default_rng(0).normal(size=(1, 3, 32, 32)).astype(np.float32)
    (logits,) = session.run(None, {feed.name: batch})
    assert logits.shape == (1, 3) and np.isfinite(logits).all()
