"""trainer.test: best.ckpt (not the last weights) on the held-out test set, as test/* in every record.

The learning rate jumps 30x after epoch 1, so the first epoch's weights are the best and the last ones are worse:
the test figures below are recomputed here with NumPy from the logits of best.ckpt's weights, and differ from
those of the last weights.
"""
import json

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor
from mindspore.graph import api

from tests.common.callbacks import read_jsonl
from trainkit.app import train
from trainkit.app.config import compose_config
from trainkit.callbacks.evaluation import ema_weights
from trainkit.step.mixed_precision import Float32EvalCell
from trainkit.tools.evaluate import main as evaluate_main

JUMP = ["lr_schedule=step", "lr_schedule.milestones=[1]", "lr_schedule.gamma=30", "trainer.epochs=2",
        "logger.progress=off", "data.eval_batch_size=1000", "wrapper.ema_decay=0.5"]


def accuracy_and_loss(logits: np.ndarray, labels: np.ndarray) -> tuple:
    logits = logits.astype(np.float64)
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    return float((logits.argmax(axis=1) == labels).mean()), float(-log_probs[np.arange(len(labels)), labels].mean())


def test_the_test_figures_come_from_best_ckpt_on_the_held_out_images(tmp_path, monkeypatch):
    eval_graph_shapes = []  # the input shapes of every graph-mode call of the evaluation network
    compile_ = api._CellGraphExecutor.compile

    def recorded(self, cell, *args, **kwargs):
        if isinstance(cell, Float32EvalCell):
            eval_graph_shapes.append(tuple(tuple(a.shape) for a in args))
        return compile_(self, cell, *args, **kwargs)

    monkeypatch.setattr(api._CellGraphExecutor, "compile", recorded)
    result = train(compose_config([f"run_dir={tmp_path}", *JUMP]))
    monkeypatch.undo()
    records = read_jsonl(tmp_path / "metrics.jsonl")
    evaluations = [r for r in records if "eval/accuracy" in r]
    assert [r["epoch"] for r in evaluations] == [1, 2] and evaluations[0]["eval/accuracy"] > evaluations[1][
        "eval/accuracy"]  # epoch 1 is the best: best.ckpt holds its weights
    (tested,) = [r for r in records if "test/accuracy" in r]
    assert tested["step"] == evaluations[-1]["step"] and tested["epoch"] == 2

    (images, labels), = list(result.data.test_dataset().create_tuple_iterator(output_numpy=True, num_epochs=1))
    (validation_images, _), = list(result.data.eval_dataset().create_tuple_iterator(output_numpy=True, num_epochs=1))
    assert len(images) != len(validation_images)
    # The test set's one batch, of a shape the validation set did not compile, ran op by op (live and EMA
    # weights): the evaluation graph was only ever called with the validation set's shape.
    assert set(eval_graph_shapes) == {(validation_images.shape, (len(validation_images),))}
    network = result.network
    network.set_train(False)
    last = accuracy_and_loss(network(Tensor(images)).asnumpy(), labels)
    with ema_weights(result.wrapper.ema):
        last_ema = accuracy_and_loss(network(Tensor(images)).asnumpy(), labels)
    ms.load_param_into_net(result.wrapper, ms.load_checkpoint(str(tmp_path / "checkpoints" / "best.ckpt")))
    best = accuracy_and_loss(network(Tensor(images)).asnumpy(), labels)
    with ema_weights(result.wrapper.ema):
        best_ema = accuracy_and_loss(network(Tensor(images)).asnumpy(), labels)
    assert best[0] != last[0]  # the two weights score differently: the test below tells them apart
    assert tested["test/accuracy"] == pytest.approx(best[0], abs=1e-9)
    assert tested["test/loss"] == pytest.approx(best[1], rel=1e-4)
    assert tested["test_ema/accuracy"] == pytest.approx(best_ema[0], abs=1e-9)
    assert abs(best_ema[1] - last_ema[1]) > 1e-3  # best.ckpt's EMA, not the last one: the loss tells them apart
    assert tested["test_ema/loss"] == pytest.approx(best_ema[1], rel=1e-4)
    assert result.metrics["test_accuracy"] == tested["test/accuracy"]
    assert result.metrics["test_ema_loss"] == tested["test_ema/loss"]

    # python -m trainkit.evaluate RUN_DIR --split test|val: best.ckpt on the chosen set
    assert evaluate_main([str(tmp_path), "--split", "test", "--output", str(tmp_path / "test.json")]) == 0
    assert evaluate_main([str(tmp_path), "--output", str(tmp_path / "val.json")]) == 0
    on_test, on_val = (json.loads((tmp_path / name).read_text()) for name in ("test.json", "val.json"))
    assert on_test["split"] == "test" and on_test["accuracy"] == pytest.approx(best[0], abs=1e-9)
    assert on_test["samples"] == len(labels)
    assert on_val["split"] == "val" and on_val["accuracy"] == pytest.approx(evaluations[0]["eval/accuracy"], abs=1e-9)


def test_a_best_ckpt_saved_at_the_last_step_is_tested_from_memory_with_the_files_figures(tmp_path, monkeypatch):
    """Where the last evaluation is the best, the network holds best.ckpt's weights: the test reads them from
    memory, not the file (ResNet-50: 0.85 s), and its figures are best.ckpt's, recomputed with NumPy."""
    loaded = []
    load = ms.load_checkpoint
    monkeypatch.setattr(ms, "load_checkpoint", lambda path, *a, **k: loaded.append(str(path)) or load(path, *a, **k))
    result = train(compose_config([f"run_dir={tmp_path}", "trainer.epochs=2", "logger.progress=off",
                                   "data.eval_batch_size=1000"]))
    best_path = tmp_path / "checkpoints" / "best.ckpt"
    records = read_jsonl(tmp_path / "metrics.jsonl")
    evaluations = [r for r in records if "eval/accuracy" in r]
    assert evaluations[1]["eval/accuracy"] > evaluations[0]["eval/accuracy"]  # the last epoch is the best
    assert str(best_path) not in loaded
    (tested,) = [r for r in records if "test/accuracy" in r]

    (images, labels), = list(result.data.test_dataset().create_tuple_iterator(output_numpy=True, num_epochs=1))
    network = result.network
    network.set_train(False)
    ms.load_param_into_net(result.wrapper, load(str(best_path)))
    best = accuracy_and_loss(network(Tensor(images)).asnumpy(), labels)
    with ema_weights(result.wrapper.ema):
        best_ema = accuracy_and_loss(network(Tensor(images)).asnumpy(), labels)
    assert tested["test/accuracy"] == pytest.approx(best[0], abs=1e-9)
    assert tested["test/loss"] == pytest.approx(best[1], rel=1e-4)
    assert tested["test_ema/accuracy"] == pytest.approx(best_ema[0], abs=1e-9)
    assert tested["test_ema/loss"] == pytest.approx(best_ema[1], rel=1e-4)


def test_trainer_test_false_and_a_data_module_without_a_test_set(tmp_path):
    result = train(compose_config([f"run_dir={tmp_path / 'off'}", "trainer.test=false", "trainer.epochs=1",
                                   "logger.progress=off"]))
    assert not any(k.startswith("test") for k in result.metrics)
    assert not any("test/accuracy" in r for r in read_jsonl(tmp_path / "off" / "metrics.jsonl"))
