"""Independent NumPy (float64) arithmetic of the training step, written from the formulas, not the code.

Semantics it encodes (the TrainingWrapper contract):
- a window of k micro-batches sums grad(loss_i) / k (= the gradient of one batch of k*b);
- loss scaling is applied, not only recorded: the backward pass runs on ``loss * scale / k`` with float32's
  range (a value beyond 3.4e38 at any stage becomes inf, as in a float32 kernel), then the gradients are
  divided by the scale;
- a window with any non-finite gradient is skipped: no optimizer step, no EMA update,
  and a dynamic scale backs off (max(1, s / factor)); after `window` good steps it grows by `factor`;
- global-norm clipping on the window's summed gradient: g * min(1, max_norm / (norm + 1e-6));
- EMA after each applied step: ema = d * ema + (1 - d) * w.
"""
from __future__ import annotations

from typing import Callable, Dict, Optional

import numpy as np

Params = Dict[str, np.ndarray]


FLOAT32_MAX = float(np.finfo(np.float32).max)


def mlp_loss_and_grads(params: Params, x: np.ndarray, y: np.ndarray, sens: float = 1.0):
    """Mean softmax cross-entropy of Dense -> Tanh -> Dense (MindSpore Dense: x @ W.T + b).

    Returns the loss and the gradients of ``loss * sens``; with ``sens != 1`` every backward value is kept in
    float32's range (beyond it: inf), so a scale too large for float32 overflows here as it does in MindSpore.
    """
    w1, b1, w2, b2 = (params[k] for k in ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"))
    x = x.astype(np.float64)
    with np.errstate(all="ignore"):  # planted NaN/inf batches propagate, as they should
        return _mlp_loss_and_grads(w1, b1, w2, b2, x, y, sens)


def _float32_range(values: np.ndarray) -> np.ndarray:
    """Values a float32 kernel cannot hold become +-inf."""
    return np.where(np.abs(values) > FLOAT32_MAX, np.sign(values) * np.inf, values)


def _mlp_loss_and_grads(w1, b1, w2, b2, x, y, sens=1.0):
    hidden = np.tanh(x @ w1.T + b1)
    logits = hidden @ w2.T + b2
    shifted = logits - logits.max(axis=1, keepdims=True)
    probs = np.exp(shifted) / np.exp(shifted).sum(axis=1, keepdims=True)
    n = len(y)
    loss = -np.mean(np.log(probs[np.arange(n), y]))
    dlogits = probs.copy()
    dlogits[np.arange(n), y] -= 1
    dlogits = _float32_range(dlogits / n * sens)
    dhidden = _float32_range(_float32_range(dlogits @ w2) * (1 - hidden ** 2))
    grads = {"fc1.weight": dhidden.T @ x, "fc1.bias": dhidden.sum(0), "fc2.weight": dlogits.T @ hidden,
             "fc2.bias": dlogits.sum(0)}
    return loss, {k: _float32_range(g) for k, g in grads.items()}


class SGDMomentum:
    """mindspore.nn.Momentum: v = m * v + g; w -= lr * v (momentum=0 is plain SGD)."""

    def __init__(self, lr: float, momentum: float = 0.0):
        self.lr, self.momentum, self.velocity = lr, momentum, {}

    def step(self, params: Params, grads: Params) -> None:
        for k, g in grads.items():
            v = self.momentum * self.velocity.get(k, 0.0) + g
            self.velocity[k] = v
            params[k] = params[k] - self.lr * v


class Adam:
    """mindspore.nn.Adam: lr_t = lr * sqrt(1 - b2^t) / (1 - b1^t); w -= lr_t * m / (sqrt(v) + eps)."""

    def __init__(self, lr: float, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8):
        self.lr, self.beta1, self.beta2, self.eps = lr, beta1, beta2, eps
        self.m, self.v, self.t = {}, {}, 0

    def step(self, params: Params, grads: Params) -> None:
        self.t += 1
        lr_t = self.lr * np.sqrt(1 - self.beta2 ** self.t) / (1 - self.beta1 ** self.t)
        for k, g in grads.items():
            self.m[k] = self.beta1 * self.m.get(k, 0.0) + (1 - self.beta1) * g
            self.v[k] = self.beta2 * self.v.get(k, 0.0) + (1 - self.beta2) * g * g
            params[k] = params[k] - lr_t * self.m[k] / (np.sqrt(self.v[k]) + self.eps)


class ReferenceTrainer:
    """The whole step in NumPy: accumulation, overflow skip, dynamic scale, clipping, EMA."""

    def __init__(self, params: Params, optimizer, *, accumulation_steps: int = 1,
                 max_grad_norm: Optional[float] = None, loss_scale: Optional[float] = None,
                 scale_factor: Optional[int] = None, scale_window: Optional[int] = None,
                 ema_decay: Optional[float] = None, ema_warmup: bool = False,
                 grad_transform: Optional[Callable[[Params], Params]] = None):
        self.params = {k: v.astype(np.float64) for k, v in params.items()}
        self.optimizer = optimizer
        self.k = accumulation_steps
        self.max_grad_norm = max_grad_norm
        self.scale, self.scale_factor, self.scale_window, self.good_steps = loss_scale, scale_factor, scale_window, 0
        self.ema_decay, self.ema_warmup, self.ema_updates = ema_decay, ema_warmup, 0
        self.ema = {k: v.copy() for k, v in self.params.items()} if ema_decay is not None else None
        self.grad_transform = grad_transform
        self.window = []
        self.optimizer_steps = 0
        self.scales_used, self.overflows, self.grad_norms = [], [], []

    def micro_step(self, x, y) -> None:
        scale = self.scale if self.scale is not None else 1.0
        _, scaled = mlp_loss_and_grads(self.params, x, y, sens=scale / self.k)  # multiply...
        self.scales_used.append(scale)
        with np.errstate(invalid="ignore"):
            self.window.append({k: g / scale for k, g in scaled.items()})  # ...then divide
        if len(self.window) < self.k:
            self.overflows.append(False)
            self.grad_norms.append(0.0)
            return
        summed = {k: sum(g[k] for g in self.window) for k in self.window[0]}
        self.window = []
        finite = all(np.all(np.isfinite(g)) for g in summed.values())
        if self.scale is not None and self.scale_factor is not None:
            self._adjust_scale(finite)
        if self.grad_transform is not None:
            summed = self.grad_transform(summed)
        norm = np.sqrt(sum(np.sum(g ** 2) for g in summed.values()))
        self.grad_norms.append(norm)
        if self.max_grad_norm is not None:
            coef = min(1.0, self.max_grad_norm / (norm + 1e-6))
            summed = {k: g * coef for k, g in summed.items()}
        self.overflows.append(not finite)
        if not finite:
            return
        self.optimizer.step(self.params, summed)
        self.optimizer_steps += 1
        if self.ema is not None:
            d = self.ema_decay
            if self.ema_warmup:
                d = min(d, (1 + self.ema_updates) / (10 + self.ema_updates))
            self.ema = {k: d * self.ema[k] + (1 - d) * self.params[k] for k in self.ema}
            self.ema_updates += 1

    def _adjust_scale(self, finite: bool) -> None:
        if not finite:
            self.scale = max(1.0, self.scale / self.scale_factor)
            self.good_steps = 0
            return
        self.good_steps += 1
        if self.good_steps == self.scale_window:
            self.scale *= self.scale_factor
            self.good_steps = 0
