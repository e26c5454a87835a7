"""Rows 2 and 3 against the peer: what each wrapper feature costs over MindSpore's bare step, next to what the
same feature costs in PyTorch over PyTorch's bare step, in one process on the same threads: each framework's sides
alternate in a block of their own that starts with an untimed call, the two blocks taking turns (a ratio compares
sides of one framework, so neither pays for waking its threads after the other ran).

PyTorch's side of each feature, as its users write it:

* dynamic loss scaling with the skip check: ``torch.amp.GradScaler("cpu")`` (scale, unscale + inf check, step, update);
* clipping: ``torch.nn.utils.clip_grad_norm_(..., foreach=True)``;
* EMA every step: timm's ``ModelEmaV3`` update, ``torch._foreach_lerp_(ema, model, 1 - decay)`` over the float
  parameters and buffers (written here, without timm);
* accumulation over 4 micro-batches: ``(loss / 4).backward()`` summing into ``.grad``, one step a window;
* everything at once: all of the above.

The accumulation rows time a window of 4 micro-batches of 8 against 4 bare steps of 8 (the window's own cost, as
row 3); the other rows one step of the full batch against one bare step.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Optional

import mindspore as ms
from mindspore import nn

from bench.common import (
    Row,
    Settings,
    Stepper,
    alternate_blocks,
    batch_tensors,
    loss_network,
    median_ms,
    ratio,
    setup,
    threads,
)
from bench.conv_impl import torch_available
from trainkit import TrainingWrapper
from trainkit.models import SmallCNN, resnet50

DECAY, MAX_NORM, K, SCALE, SCALE_WINDOW = 0.999, 1.0, 4, 2.0 ** 10, 1000

#: feature -> (wrapper arguments, whether it is an accumulation window)
FEATURES: Dict[str, tuple] = {
    "dynamic loss scale + skip check": (lambda: {"loss_scale": ms.amp.DynamicLossScaler(SCALE, 2, SCALE_WINDOW)},
                                        False),
    "clipping": (lambda: {"max_grad_norm": MAX_NORM}, False),
    "EMA every step": (lambda: {"ema_decay": DECAY}, False),
    "accumulation, 4 micro-batches": (lambda: {"accumulation_steps": K}, True),
    "everything at once": (lambda: {"loss_scale": ms.amp.DynamicLossScaler(SCALE, 2, SCALE_WINDOW),
                                    "max_grad_norm": MAX_NORM, "ema_decay": DECAY, "accumulation_steps": K}, True),
}


def _mindspore_step(builder, batch: int, image: int, channels: int, warmup: int, **wrapper_args) -> Stepper:
    ms.set_seed(0)
    backbone = builder()
    optimizer = nn.Momentum(backbone.trainable_params(), learning_rate=0.01, momentum=0.9)
    if wrapper_args:
        cell = TrainingWrapper(loss_network(backbone), optimizer, **wrapper_args)
    else:
        cell = nn.TrainOneStepCell(loss_network(backbone), optimizer)
    return Stepper(cell, batch_tensors(batch, channels, image), warmup)


class TorchStep:
    """One PyTorch SGD-momentum step of ResNet-50 on a fixed batch, with the chosen features."""

    def __init__(self, batch: int, image: int, *, scaler: bool = False, clip: bool = False, ema: bool = False,
                 accumulation: int = 1, tiny: bool = False):
        import torch

        from bench.torch_resnet import ResNet50

        torch.set_num_threads(threads())
        torch.manual_seed(0)
        self.torch = torch
        self.model = (_tiny_torch_cnn(torch) if tiny else ResNet50()).train()
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
        self.loss = torch.nn.CrossEntropyLoss()
        generator = torch.Generator().manual_seed(0)
        self.images = torch.randn(batch, 3, image, image, generator=generator)
        self.labels = torch.arange(batch) % 10
        self.scaler = torch.amp.GradScaler("cpu", init_scale=SCALE, growth_factor=2.0, backoff_factor=0.5,
                                           growth_interval=SCALE_WINDOW) if scaler else None
        self.clip = clip
        self.accumulation = accumulation
        self.ema: Optional[tuple] = None
        if ema:  # timm ModelEmaV3: every floating-point tensor of the state dict, lerped in one foreach call
            live = [t for t in self.model.state_dict().values() if t.is_floating_point()]
            self.ema = ([t.detach().clone() for t in live], live)

    def step(self) -> float:
        torch = self.torch
        self.optimizer.zero_grad(set_to_none=True)
        for _ in range(self.accumulation):
            loss = self.loss(self.model(self.images), self.labels) / self.accumulation
            (self.scaler.scale(loss) if self.scaler is not None else loss).backward()
        if self.scaler is not None and self.clip:
            self.scaler.unscale_(self.optimizer)
        if self.clip:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), MAX_NORM, foreach=True)
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        if self.ema is not None:
            with torch.no_grad():
                torch._foreach_lerp_(self.ema[0], self.ema[1], 1.0 - DECAY)
        return loss.item()


def _tiny_torch_cnn(torch):
    """The smoke test's stand-in for ResNet-50: it only proves the PyTorch side runs."""
    nn_ = torch.nn
    return nn_.Sequential(nn_.Conv2d(3, 8, 3, padding=1), nn_.BatchNorm2d(8), nn_.ReLU(), nn_.AdaptiveAvgPool2d(1),
                          nn_.Flatten(), nn_.Linear(8, 10))


def _torch_sides(features: dict, batch: int, micro: int, image: int, warmup: int,
                 tiny: bool) -> Dict[str, Callable[[], object]]:
    flags = {
        "dynamic loss scale + skip check": dict(scaler=True),
        "clipping": dict(clip=True),
        "EMA every step": dict(ema=True),
        "accumulation, 4 micro-batches": dict(accumulation=K),
        "everything at once": dict(scaler=True, clip=True, ema=True, accumulation=K),
    }
    steps = {"bare": TorchStep(batch, image, tiny=tiny), "bare micro": TorchStep(micro, image, tiny=tiny)}
    for feature, (_, window) in features.items():
        steps[feature] = TorchStep(micro if window else batch, image, tiny=tiny, **flags[feature])
    for step in steps.values():
        for _ in range(1 + warmup):
            step.step()
    return {name: step.step for name, step in steps.items()}


def run(settings: Settings) -> List[Row]:
    micro = max(settings.batch // K, 2)  # batch norm needs 2 samples
    features = FEATURES
    if settings.smoke:  # proves the rows run: small CNNs on both sides, one feature row, no ResNet-50 compiles
        features = {name: FEATURES[name] for name in ("everything at once",)}
        builder, channels, image, model = (lambda: SmallCNN(num_classes=10, in_channels=3)), 3, 8, "small_cnn"
    else:
        builder, channels, image, model = (lambda: resnet50(num_classes=10)), 3, settings.image, "resnet50"
    where = setup(model, f"{settings.batch} (accumulation: {K} x {micro})", image, reps=settings.reps,
                  steps_per_rep=settings.large_steps)
    if not torch_available():
        message = "PyTorch is not installed: pip install -e '.[bench]' (torch==2.13.0, CPU build)"
        return [Row("3" if window else "2", f"peer: {feature} / bare step, trainkit (bar: PyTorch's)", None, "x",
                    "<= PyTorch", None, "", message, where) for feature, (_, window) in FEATURES.items()]
    import torch

    steps = settings.large_steps
    sides: Dict[str, Callable[[], object]] = {}
    torch_sides: Dict[str, Callable[[], object]] = {}
    mindspore_steps = {"bare micro": _mindspore_step(builder, micro, image, channels, settings.warmup)}
    if any(not window for _, window in features.values()):
        mindspore_steps["bare"] = _mindspore_step(builder, settings.batch, image, channels, settings.warmup)
    for feature, (arguments, window) in features.items():
        mindspore_steps[feature] = _mindspore_step(builder, micro if window else settings.batch, image, channels,
                                                   settings.warmup, **arguments())
    for name, stepper in mindspore_steps.items():
        window = name == "bare micro" or FEATURES.get(name, (None, False))[1]
        sides["ms " + name] = stepper.run(K * steps if window else steps)
    for name, call in _torch_sides(features, settings.batch, micro, image, settings.warmup,
                                          settings.smoke).items():
        # a PyTorch window is one call of K micro-batches; its bare side K calls of one
        calls = K * steps if name == "bare micro" else steps
        torch_sides["torch " + name] = (lambda call=call, calls=calls: [call() for _ in range(calls)])
    seconds = alternate_blocks({"mindspore": sides, "torch": torch_sides}, settings.reps)
    where = {**where, "torch": torch.__version__, "torch_threads": torch.get_num_threads()}
    rows = []
    for feature, (_, window) in features.items():
        bare = "bare micro" if window else "bare"
        ours, ours_spread = ratio(seconds, "ms " + feature, "ms " + bare)
        theirs, theirs_spread = ratio(seconds, "torch " + feature, "torch " + bare)
        per = K * steps if window else steps
        details = (f"trainkit {ours:.3f}x (spread {ours_spread}; {median_ms(seconds['ms ' + feature], per)} vs "
                   f"{median_ms(seconds['ms ' + bare], per)} per micro-step), PyTorch {theirs:.3f}x (spread "
                   f"{theirs_spread}; {median_ms(seconds['torch ' + feature], per)} vs "
                   f"{median_ms(seconds['torch ' + bare], per)})")
        rows.append(Row("3" if window else "2", f"peer: {feature} / bare step, trainkit (bar: PyTorch's)", ours,
                        "x", f"<= {theirs:.3f}", ours <= theirs, f"trainkit {ours_spread}; PyTorch {theirs_spread}",
                        details, where))
    return rows
