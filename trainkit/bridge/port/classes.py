"""What ``port`` writes for layers that torchvision and timm define on top of ``torch.nn``.

Their ``forward`` is written for TorchScript and ONNX export (timm's ``BatchNormAct2d`` is a copy of
``BatchNorm2d.forward`` with an ``_assert`` on the input's rank and every training branch), or calls a function
whose randomness is only seen in training (stochastic depth). Tracing them would give unreadable code or
nothing; they become one MindSpore layer each, written with PyTorch's arithmetic and PyTorch's parameter names:

- ``LayerNorm2d`` (ConvNeXt's, both libraries'): a layer norm over the channels of an NCHW tensor;
- ``BatchNormAct2d`` (timm): batch norm, then its ``drop`` and ``act`` children, ported as any child;
- ``StochasticDepth`` (torchvision) and ``DropPath`` (timm): trainkit's :class:`~trainkit.models.dropout.DropPath`,
  per sample as PyTorch trains it, drawn from a counter a checkpoint keeps, so a resumed run draws the same paths;
- timm's ``Linear`` (a ``nn.Linear`` whose forward casts for AMP): ``nn.Dense``;
- transformers' GELU activations: ``nn.GELU``, the tanh formula's (``NewGELUActivation``: GPT-2's, ALBERT's;
  ``GELUTanh``, ``FastGELUActivation``) as ``approximate=True``, which MindSpore computes to float precision where
  the formula written out with ``ops.tanh`` (off by up to 1e-4 on CPU) would not; ``GELUActivation`` (BERT's, erf)
  as ``approximate=False``.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Tuple

from trainkit.bridge.port.layers import LAYERS, Call, Unsupported

HELPERS: Dict[str, str] = {
    "LayerNorm2d": '''
class LayerNorm2d(nn.LayerNorm):
    """ConvNeXt's LayerNorm2d: a layer norm over the channels of an NCHW tensor (PyTorch's, moved to the last axis)."""

    def __init__(self, num_channels, eps=1e-6):
        super().__init__((num_channels,), begin_norm_axis=-1, begin_params_axis=-1, epsilon=eps)

    def construct(self, x):
        return ops.permute(super().construct(ops.permute(x, (0, 2, 3, 1))), (0, 3, 1, 2))
''',
    "BatchNormAct2d": '''
class BatchNormAct2d(nn.BatchNorm2d):
    """timm's BatchNormAct2d: batch norm, then its drop and act layers (PyTorch's names)."""

    def __init__(self, num_features, eps, momentum, drop, act):
        super().__init__(num_features, eps=eps, momentum=momentum)
        self.drop = drop
        self.act = act

    def construct(self, x):
        return self.act(self.drop(super().construct(x)))
''',
}
#: The import lines each helper (or layer) needs beyond ``from mindspore import nn, ops``.
IMPORTS: Dict[str, Tuple[str, ...]] = {"DropPath": ("from trainkit.models.dropout import DropPath",)}


def _layer_norm_2d(module: Any, child: Callable[[str], Any]) -> Call:
    if not module.elementwise_affine or getattr(module, "bias", True) is None:
        raise Unsupported("affine=False or bias=False")
    return Call("LayerNorm2d", {"num_channels": module.normalized_shape[0], "eps": module.eps},
                helper="LayerNorm2d")


def _batch_norm_act(module: Any, child: Callable[[str], Any]) -> Call:
    norm = LAYERS["BatchNorm2d"](module)
    return Call("BatchNormAct2d", {**norm.kwargs, "drop": child("drop"), "act": child("act")},
                helper="BatchNormAct2d")


def _stochastic_depth(module: Any, child: Callable[[str], Any]) -> Call:
    if module.mode not in ("row", "batch"):
        raise Unsupported(f"mode={module.mode!r} (row or batch)")
    return _drop_path(float(module.p), module.mode == "row", True)


def _timm_drop_path(module: Any, child: Callable[[str], Any]) -> Call:
    return _drop_path(float(module.drop_prob), True, bool(module.scale_by_keep))


def _drop_path(p: float, per_sample: bool, scale: bool) -> Call:
    if not 0 <= p < 1:
        raise Unsupported(f"p={p} (a probability in [0, 1))")
    kwargs: Dict[str, Any] = {"p": p}
    if not per_sample:
        kwargs["per_sample"] = False
    if not scale:
        kwargs["scale"] = False
    return Call("DropPath", kwargs, helper="DropPath")


#: qualified class name -> the Call building it from the module and a function porting one of its children
CLASSES: Dict[str, Callable[[Any, Callable[[str], Any]], Call]] = {
    "torchvision.models.convnext.LayerNorm2d": _layer_norm_2d,
    "timm.layers.norm.LayerNorm2d": _layer_norm_2d,
    "timm.layers.norm_act.BatchNormAct2d": _batch_norm_act,
    "torchvision.ops.stochastic_depth.StochasticDepth": _stochastic_depth,
    "timm.layers.drop.DropPath": _timm_drop_path,
    "timm.layers.linear.Linear": lambda module, child: LAYERS["Linear"](module),
    **{f"transformers.activations.{name}": lambda module, child: Call("nn.GELU", {"approximate": True})
       for name in ("NewGELUActivation", "GELUTanh", "FastGELUActivation")},
    "transformers.activations.GELUActivation": lambda module, child: Call("nn.GELU", {"approximate": False}),
}


def class_call(module: Any, child: Callable[[str], Any]) -> Optional[Call]:
    """The Call of a torchvision or timm layer of :data:`CLASSES`, else None.

    Raises:
        Unsupported: one of its options is not covered.
    """
    kind = type(module)
    name = f"{kind.__module__}.{kind.__qualname__}"
    if name not in CLASSES:
        return None
    try:
        return CLASSES[name](module, child)
    except Unsupported as error:
        raise Unsupported(f"{name} with {error}") from error
