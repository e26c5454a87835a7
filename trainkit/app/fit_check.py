"""Check that the data, the model and the loss fit together before anything compiles.

A graph that does not fit fails deep in MindSpore's compiler with tens of lines about kernels
(``SparseSoftmaxCrossEntropyWithLogits ... labels_type must be Int32/Int64``) -- or worse, it fits by
broadcasting and trains the wrong thing (an output ``(batch, 1)`` against labels ``(batch,)`` under an MSE is a
``(batch, batch)`` difference). Instead, one batch's first samples go through the float32 model and the loss,
eagerly (PyNative) and in evaluation mode (batch-norm statistics untouched), and whatever does not fit is said in
one line naming the key to change.

A second run of a config whose compile cache folder (keyed by the config and the sources,
:mod:`trainkit.app.compile_cache`) records a passed check of the same first evaluation batch skips the forward pass
(0.1-0.2 s): the check is a function of the config, the code and that batch, all three the same.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn
from mindspore import dtype as mstype
from mindspore.train import F1, Accuracy, Loss, Metric, Precision, Recall, TopKCategoricalAccuracy

from trainkit.errors import ConfigError

SAMPLES = 2  # enough for the batch dimension to show; batch norm in evaluation mode needs no more
# Losses that compare output and label element by element (a shape mismatch broadcasts silently).
ELEMENTWISE_LOSSES = (nn.MSELoss, nn.L1Loss, nn.SmoothL1Loss, nn.BCEWithLogitsLoss, nn.HuberLoss)
# Metrics that read the output as one score per class.
CLASSIFICATION_METRICS = (Accuracy, Precision, Recall, F1, TopKCategoricalAccuracy)


RECORD = "fit_check.json"  # in a compile cache folder: the inputs of a check that passed, and its answer


def check_fit(backbone: nn.Cell, loss_fn: nn.Cell, dataset: Any, loss_name: str, model_name: str,
              metrics: Optional[Dict[str, Metric]] = None, num_classes: Optional[int] = None,
              passed_in: Optional[Path] = None) -> Optional[int]:
    """Raise ConfigError when `dataset`'s batches, `backbone`, `loss_fn` and `metrics` do not fit together; return
    the model's output width when the loss takes class labels (they must lie in ``[0, width)``), else None.

    Args:
        backbone: the model, before mixed precision.
        loss_fn: the loss Cell, called as ``loss_fn(output, label)``.
        dataset: a batched dataset (its first batch is read through a separate iterator).
        loss_name: how the config names the loss (``loss=cross_entropy``).
        model_name: how the config names the model (``model (trainkit.models.mlp.MLP)``).
        metrics: the evaluation's metrics by name; each is updated once with the output and the label, then
            cleared.
        num_classes: the data's number of classes, when it knows it: with a classification loss or metric, the
            output's width must equal it, whatever the model's key for it is called.
        passed_in: this config's compile cache folder, or None: where it records that the check passed for the
            same first batch, the forward pass is skipped and the recorded answer returned; a check that passes
            is recorded there.
    """
    batch, batch_label, columns = _first_batch(dataset)
    data, label = batch[:SAMPLES], batch_label[:SAMPLES]
    inputs = None
    if passed_in is not None:
        inputs = _fingerprint(batch, batch_label, columns, loss_fn, loss_name, model_name, metrics, num_classes)
        passed = _recorded(passed_in / RECORD, inputs)
        if passed is not None:
            return passed[0]
    outputs = _check(backbone, loss_fn, data, label, columns, loss_name, model_name, metrics, num_classes,
                     batch_label)
    if inputs is not None:
        _record(passed_in / RECORD, inputs, outputs)
    return outputs


def _check(backbone: nn.Cell, loss_fn: nn.Cell, data: Tensor, label: Tensor, columns: list, loss_name: str,
           model_name: str, metrics: Optional[Dict[str, Metric]], num_classes: Optional[int],
           batch_label: Tensor) -> Optional[int]:
    mode = ms.get_context("mode")
    training = backbone.training
    ms.set_context(mode=ms.PYNATIVE_MODE)
    try:
        backbone.set_train(False)
        try:
            output = backbone(data)
        except Exception as error:  # MindSpore raises TypeError, ValueError or RuntimeError for shapes and types
            raise ConfigError(f"{model_name} cannot take the data's input {columns[0]!r} {_describe(data)}: "
                              f"{_first_line(error)}; check the model's keys that depend on the data "
                              "(in_features, in_channels, ...: null fills them from the data)") from error
        if not isinstance(output, Tensor):
            raise ConfigError(f"{model_name} returns {type(output).__name__}: it must return one Tensor, the "
                              "output the loss takes")
        output = output.astype(mstype.float32)
        _check_label(output, label, loss_fn, loss_name, columns)
        _check_label_values(output, batch_label, loss_fn, loss_name, columns)
        _check_classes(output, label, loss_fn, metrics or {}, num_classes, model_name)
        try:
            value = loss_fn(output, label)
        except Exception as error:
            raise ConfigError(f"{loss_name} cannot take the model's output {_describe(output)} with the label "
                              f"{columns[1]!r} {_describe(label)}: {_first_line(error)}") from error
        if not isinstance(value, Tensor) or value.size != 1:
            shape = value.shape if isinstance(value, Tensor) else type(value).__name__
            raise ConfigError(f"{loss_name} returns {shape}, not one number: set its reduction to mean "
                              "(e.g. loss.reduction=mean)")
        for name, metric in (metrics or {}).items():
            if not isinstance(metric, Loss):
                _check_metric(name, metric, output, label)
        return int(output.shape[1]) if _takes_class_labels(loss_fn, output, label) else None
    finally:
        backbone.set_train(training)
        ms.set_context(mode=mode)


def _fingerprint(batch: Tensor, batch_label: Tensor, columns: list, loss_fn: nn.Cell, loss_name: str, model_name: str,
                 metrics: Optional[Dict[str, Metric]], num_classes: Optional[int]) -> str:
    """What the check reads beyond the config and the code (the cache folder's key): the first evaluation batch,
    whole, and what the data says of its classes; the names and types for good measure."""
    digest = hashlib.sha256()
    for tensor in (batch, batch_label):
        array = np.ascontiguousarray(tensor.asnumpy())
        digest.update(f"{array.dtype.str} {array.shape}".encode())
        digest.update(array.tobytes())
    described = [columns, num_classes, loss_name, model_name, type(loss_fn).__qualname__,
                 sorted((name, type(metric).__qualname__) for name, metric in (metrics or {}).items())]
    digest.update(repr(described).encode())
    return digest.hexdigest()


def _recorded(path: Path, inputs: str) -> Optional[Tuple[Optional[int]]]:
    """``(outputs,)`` of a check of `inputs` that passed, as `path` records it; None where it records none."""
    try:
        record = json.loads(path.read_text())
        if record.get("inputs") == inputs and "outputs" in record \
                and (record["outputs"] is None or isinstance(record["outputs"], int)):
            return (record["outputs"],)
    except (OSError, ValueError, AttributeError):
        pass
    return None


def _record(path: Path, inputs: str, outputs: Optional[int]) -> None:
    try:
        temporary = path.with_name(f".{path.name}.{os.getpid()}")
        temporary.write_text(json.dumps({"inputs": inputs, "outputs": outputs}))
        os.replace(temporary, path)
    except OSError:  # a record saves time; never worth a failed run
        pass


def _first_batch(dataset: Any) -> Tuple[Tensor, Tensor, list]:
    columns = list(dataset.get_col_names())
    if len(columns) != 2:
        raise ConfigError(f"the data gives {len(columns)} column(s) ({', '.join(columns)}): trainkit takes two, the "
                          "network's input first and the target second; have the data module's datasets give those "
                          "two (e.g. dataset.project([input, target]))")
    iterator = dataset.create_tuple_iterator(num_epochs=1)
    try:
        data, label = next(iterator)
    except StopIteration as error:
        raise ConfigError("the evaluation data is empty: the data module's eval_dataset() gives no batch") from error
    finally:
        iterator.stop()
    return data, label, columns


def _check_label(output: Tensor, label: Tensor, loss_fn: nn.Cell, loss_name: str, columns: list) -> None:
    """The mismatches MindSpore would report only when compiling, or not at all."""
    integer_label = label.dtype in mstype.int_type + mstype.uint_type
    if getattr(loss_fn, "sparse_labels", False) or _is_sparse_cross_entropy(loss_fn, output, label):
        if not integer_label:
            raise ConfigError(f"{loss_name} takes integer class labels, but the data's label {columns[1]!r} is "
                              f"{_describe(label)}: for regression targets use loss=mse (or l1, smooth_l1), for "
                              "0/1 targets loss=bce_with_logits, or give int32 class labels")
        if output.ndim != 2 or label.shape != output.shape[:1]:
            raise ConfigError(f"{loss_name} takes logits (batch, classes) and labels (batch,), but the model's "
                              f"output is {_describe(output)} and the label {_describe(label)}: check "
                              "model.num_classes (null: from the data) or the data's label shape")
    elif isinstance(loss_fn, ELEMENTWISE_LOSSES):
        if isinstance(loss_fn, nn.BCEWithLogitsLoss) and integer_label:
            raise ConfigError(f"{loss_name} takes float 0/1 labels, but the data's label {columns[1]!r} is "
                              f"{_describe(label)}: cast it to float32 in the data module, or for class indices "
                              "use loss=cross_entropy")
        if output.shape != label.shape:
            raise ConfigError(f"{loss_name} compares output and label element by element, but the model's output "
                              f"is {_describe(output)} and the label {columns[1]!r} {_describe(label)}: make the "
                              "model give the label's shape (e.g. model.out_features, null: from the data) or the "
                              "data module give labels shaped like the output")


def _check_classes(output: Tensor, label: Tensor, loss_fn: nn.Cell, metrics: Dict[str, Metric],
                   num_classes: Optional[int], model_name: str) -> None:
    """One score per class: an output narrower than the classes crashes at step 1 (cross-entropy) or trains
    silently wrong (a loss of the user's own). A wider one is allowed, as a num_classes above the data's is (a
    head shared with a larger label set)."""
    if not num_classes or output.ndim != 2 or label.ndim != 1:
        return
    if label.dtype not in mstype.int_type + mstype.uint_type:
        return
    classification = getattr(loss_fn, "sparse_labels", False) or _is_sparse_cross_entropy(loss_fn, output, label) \
        or any(isinstance(metric, CLASSIFICATION_METRICS) for metric in metrics.values())
    if classification and output.shape[1] < num_classes:
        raise ConfigError(f"{model_name} gives {output.shape[1]} scores per sample, but the data has {num_classes} "
                          f"classes: set the model's output width to at least {num_classes} (its num_classes, "
                          "out_features or your own key for it; null fills num_classes and out_features from the data)")


def _check_label_values(output: Tensor, label: Tensor, loss_fn: nn.Cell, loss_name: str, columns: list) -> None:
    """Class labels of the first evaluation batch against the model's outputs: a label the logits have no entry for
    would fail after compiling, or (with a model sized from the data) mean a class that does not exist."""
    if not _takes_class_labels(loss_fn, output, label):
        return
    classes = output.shape[1]
    values = label.asnumpy().reshape(-1)
    bad = (values < 0) | (values >= classes)
    if bad.any():
        index = int(bad.argmax())
        raise ConfigError(f"{loss_name}: the first evaluation batch's label {columns[1]!r}, sample {index}, is "
                          f"{values[index]}, but the model has {classes} outputs: class labels must be integers in "
                          f"[0, {classes}); check the data (trainkit.data.check_values) or model.num_classes")


def _check_metric(name: str, metric: Metric, output: Tensor, label: Tensor) -> None:
    try:
        metric.clear()
        metric.update(output, label)
        metric.eval()
    except Exception as error:  # numpy's and MindSpore's ValueError, TypeError, RuntimeError
        raise ConfigError(f"metrics.{name} ({type(metric).__module__}.{type(metric).__name__}) cannot take the "
                          f"model's output {_describe(output)} with the label {_describe(label)}: "
                          f"{_first_line(error)}; choose metrics for this task (e.g. metrics=regression)") from error
    finally:
        metric.clear()


def _takes_class_labels(loss_fn: nn.Cell, output: Tensor, label: Tensor) -> bool:
    return bool(getattr(loss_fn, "sparse_labels", False)) or _is_sparse_cross_entropy(loss_fn, output, label)


def _is_sparse_cross_entropy(loss_fn: nn.Cell, output: Tensor, label: Tensor) -> bool:
    if isinstance(loss_fn, nn.SoftmaxCrossEntropyWithLogits):
        return bool(getattr(loss_fn, "sparse", False))
    return isinstance(loss_fn, nn.CrossEntropyLoss) and label.ndim == output.ndim - 1


def _describe(tensor: Tensor) -> str:
    return f"{str(tensor.dtype).lower()} {tuple(tensor.shape)}"


def _first_line(error: BaseException) -> str:
    """MindSpore's messages run over many lines (C++ stacks): the first one that says something."""
    for line in str(error).splitlines():
        line = line.strip()
        if line and not line.startswith(("-", "#", "[")):
            return line[:300]
    return type(error).__name__

