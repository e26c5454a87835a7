"""python -m trainkit.evaluate: a converted checkpoint evaluated as NumPy computes it, and bad input."""
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tests.bridge.test_convert import user_project, write_mapping  # noqa: E402
from tests.common import torch_models  # noqa: E402
from tests.common.user_project import BlobData  # noqa: E402
from trainkit.bridge.convert import main as convert  # noqa: E402
from trainkit.tools.evaluate import main  # noqa: E402


def numpy_evaluation(state, batch_size):
    """The user's MLP on BlobData's evaluation set (in order, batches of `batch_size`), in NumPy."""
    images, labels = BlobData(batch_size=batch_size).arrays
    weights = {name: value.numpy().astype(np.float64) for name, value in state.items()}
    hidden = np.maximum(images @ weights["encoder.weight"].T + weights["encoder.bias"], 0)
    logits = hidden @ weights["classifier.weight"].T + weights["classifier.bias"]
    shifted = logits - logits.max(axis=1, keepdims=True)
    losses = np.log(np.exp(shifted).sum(axis=1)) - shifted[np.arange(len(labels)), labels]
    predicted = logits.argmax(axis=1)
    confusion = np.zeros((3, 3), dtype=np.int64)
    np.add.at(confusion, (labels, predicted), 1)
    batch_losses = [losses[i:i + batch_size].mean() for i in range(0, len(labels), batch_size)]
    return (predicted == labels).mean(), float(np.mean(batch_losses)), confusion


def test_a_converted_checkpoint_evaluates_as_numpy_computes_it(tmp_path, capsys):
    model = torch_models.UserMLP(seed=6)
    with torch.no_grad():  # a weak model, so the confusion matrix has errors off the diagonal
        model.classifier.weight.mul_(0.3)
        model.classifier.weight[:, :3] = torch.tensor([[1.0, -1.0, 0.5], [-1.0, 1.0, 0.5], [0.2, 0.2, 0.2]])
        model.encoder.weight[:3, :3] = torch.eye(3)
    torch.save(model.state_dict(), tmp_path / "user.pth")
    overrides = user_project(tmp_path)
    assert convert([str(tmp_path / "user.pth"), str(tmp_path / "user.ckpt"), *overrides,
                    "--mapping", str(write_mapping(tmp_path))]) == 0
    capsys.readouterr()
    assert main([str(tmp_path / "user.ckpt"), *overrides, "data.batch_size=16", "--output",
                 str(tmp_path / "eval.json")]) == 0
    result = json.loads((tmp_path / "eval.json").read_text())
    accuracy, loss, confusion = numpy_evaluation(model.state_dict(), 16)
    assert 0.2 < accuracy < 1 and np.count_nonzero(confusion - np.diag(np.diag(confusion)))  # errors to count
    assert result["accuracy"] == pytest.approx(accuracy, abs=1e-9)
    assert result["loss"] == pytest.approx(loss, rel=1e-5)
    assert result["confusion_matrix"] == confusion.tolist()
    np.testing.assert_allclose(result["per_class_accuracy"], np.diag(confusion) / confusion.sum(axis=1))
    assert result["samples"] == 96
    assert f"accuracy {accuracy:.4f}" in capsys.readouterr().out


def test_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys):
    (tmp_path / "corrupt.ckpt").write_bytes(b"not a checkpoint")
    (tmp_path / "taken.json").write_text("{}")
    (tmp_path / "empty_run").mkdir()
    (tmp_path / "weights.pth").write_bytes(b"PK")  # what a PyTorch user has first
    cases = [([str(tmp_path / "weights.pth"), "model=resnet18"], "weights.pth is a PyTorch file, not a MindSpore "
                                                                  "checkpoint: convert it first (python -m "
                                                                  "trainkit.convert"),
             ([str(tmp_path / "absent.ckpt")], "absent.ckpt does not exist"),
             ([str(tmp_path / "corrupt.ckpt"), "model=resnet18"], "corrupt.ckpt cannot be read: it is corrupt"),
             ([str(tmp_path / "empty_run")], "holds no checkpoint"),
             ([str(tmp_path / "corrupt.ckpt"), "--output", str(tmp_path / "taken.json")], "already exists")]
    for argv, message in cases:
        assert main(argv) == 2, message
        err = capsys.readouterr().err
        assert err.startswith("trainkit: error: ") and err.count("\n") == 1 and message in err, err
    assert (tmp_path / "taken.json").read_text() == "{}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corrupt.ckpt", "empty_run", "taken.json", "weights.pth"]


def test_model_pretrained_given_a_pytorch_file_points_to_convert(tmp_path):
    from omegaconf import OmegaConf

    from tests.common.models import TinyMLP
    from trainkit.app.finetune import apply_finetuning
    from trainkit.errors import CheckpointError

    (tmp_path / "resnet.pth").write_bytes(b"PK")
    with pytest.raises(CheckpointError, match=r"model.pretrained: .*resnet.pth is a PyTorch file, .* convert it first"):
        apply_finetuning(OmegaConf.create({"pretrained": str(tmp_path / "resnet.pth")}), TinyMLP())
