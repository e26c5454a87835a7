"""Mixed precision: a backbone cast by `mindspore.amp`, with the loss always computed in float32."""
from __future__ import annotations

from mindspore import amp, nn, ops
from mindspore import dtype as mstype

from trainkit.step.rare_shapes import OpByOpForNewShapes

AMP_LEVELS = ("O0", "O1", "O2", "O3")


class Float32LossCell(nn.Cell):
    """``loss_fn(backbone(x).astype(float32), label)``: a half-precision backbone, a float32 loss."""

    def __init__(self, backbone: nn.Cell, loss_fn: nn.Cell):
        super().__init__(auto_prefix=False)
        self.backbone = backbone
        self.loss_fn = loss_fn

    def construct(self, data, label):
        return self.loss_fn(self.backbone(data).astype(mstype.float32), label)


def build_loss_network(backbone: nn.Cell, loss_fn: nn.Cell, amp_level: str = "O0") -> nn.Cell:
    """Apply ``mindspore.amp.auto_mixed_precision(backbone, amp_level)`` and add a float32 loss.

    Args:
        backbone: the model, returning logits.
        loss_fn: a loss Cell taking ``(logits, label)``.
        amp_level: one of O0 (float32), O1 (white-listed ops in float16), O2 (all but
            the black list, e.g. batch norm, in float16), O3 (everything in float16).

    Raises:
        ValueError: for an unknown `amp_level`.
    """
    if amp_level not in AMP_LEVELS:
        raise ValueError(f"amp_level must be one of {', '.join(AMP_LEVELS)}; got {amp_level!r}")
    if amp_level != "O0":
        backbone = amp.auto_mixed_precision(backbone, amp_level)
    return Float32LossCell(backbone, loss_fn)


class Float32EvalCell(OpByOpForNewShapes, Float32LossCell):
    """``(losses, logits, label)`` with float32 logits, for ``Model(eval_network=..., eval_indexes=[0, 1, 2])``.

    A loss that reduces the batch to one number comes out repeated once per sample, so that a metric can weight
    each batch by its size: MindSpore's ``Loss`` metric averages the batches' means, which over-weights a smaller
    last batch (see ``trainkit.callbacks.evaluation.SampleMeanLoss``). Inside ``new_shapes_op_by_op()`` (the test
    set's evaluation) a batch shape the graph has not compiled runs op by op (``trainkit.step.rare_shapes``), when
    the backbone is float32 without AMP: there the two give the same bits.
    """

    def __init__(self, backbone: nn.Cell, loss_fn: nn.Cell):
        super().__init__(backbone, loss_fn)
        self.op_by_op_allowed = is_plain_float32(backbone)

    def construct(self, data, label):
        logits = self.backbone(data).astype(mstype.float32)
        loss = self.loss_fn(logits, label)
        if loss.ndim == 0:  # decided when compiling: the shape is static
            loss = ops.broadcast_to(loss.reshape((1,)), (logits.shape[0],))
        return loss, logits, label


def casts_to_half(network: nn.Cell) -> bool:
    """Whether an AMP level or a ``to_float(float16 | bfloat16)`` Cell runs part of `network` in half precision.
    Op by op, MindSpore then casts the inputs of every operator inside such a Cell; a graph only the Cell's own."""
    return applied_amp_level(network) != "O0" or any(
        getattr(getattr(cell, "mixed_precision_type", None), "name", None) in ("FP16", "BF16")
        for _, cell in network.cells_and_names())


def is_plain_float32(network: nn.Cell) -> bool:
    """Whether `network` runs in float32 throughout: nothing cast to half precision (:func:`casts_to_half`), every
    Parameter float32 (where a graph and op-by-op execution give the same bits)."""
    return not casts_to_half(network) and all(p.dtype == mstype.float32 for p in network.get_parameters())


def applied_amp_level(backbone: nn.Cell) -> str:
    """The level ``mindspore.amp.auto_mixed_precision`` applied to `backbone`, read from the network itself.

    MindSpore marks the network it returns (``_amp_level``); a network it never processed ran at O0. A run
    records this, not the configured level, so a record of O2 means the cast really happened.
    """
    level = getattr(backbone, "_amp_level", "O0")
    return level if level in AMP_LEVELS else "O0"
