"""Rows 1, 2, 3 and 8: what TrainingWrapper costs over MindSpore's own training cells, in step and compile time."""
from __future__ import annotations

from typing import Callable, List, Tuple

import mindspore as ms
from mindspore import nn

from bench.common import (
    Row,
    Settings,
    Stepper,
    alternate,
    batch_tensors,
    large_backbone,
    loss_network,
    median_ms,
    ratio,
    setup,
)
from trainkit import TrainingWrapper
from trainkit.models import SmallCNN


def models(settings: Settings) -> List[Tuple[str, Callable[[], nn.Cell], tuple]]:
    """(name, builder, input shape): the small CNN on digit-sized images (loop overhead shows most) and ResNet-50."""
    small = ("small_cnn", lambda: SmallCNN(num_classes=10, in_channels=1), (settings.batch, 1, 8, 8))
    image = settings.image
    large = (settings.large_model, lambda: large_backbone(settings), (settings.batch, 3, image, image))
    return [small, large]


def _momentum(backbone: nn.Cell) -> nn.Optimizer:
    return nn.Momentum(backbone.trainable_params(), learning_rate=0.01, momentum=0.9)


def _build(kind: str, builder, **wrapper_args) -> nn.Cell:
    ms.set_seed(0)
    backbone = builder()
    optimizer = _momentum(backbone)
    if kind == "baseline":
        return nn.TrainOneStepCell(loss_network(backbone), optimizer)
    if kind == "loss_scale_cell":
        return nn.TrainOneStepWithLossScaleCell(loss_network(backbone), optimizer,
                                                nn.DynamicLossScaleUpdateCell(2.0 ** 10, 2, 1000))
    return TrainingWrapper(loss_network(backbone), optimizer, **wrapper_args)


def _dynamic() -> ms.amp.DynamicLossScaler:
    return ms.amp.DynamicLossScaler(2.0 ** 10, 2, 1000)


#: The wrapper configurations timed against TrainOneStepCell: the two of the bars, then each feature alone, so the
#: table says what each one costs. A scaler holds Parameters, so each configuration gets a new one.
CONFIGS = {
    "off": lambda: {"skip_nonfinite": False},
    "on": lambda: {"loss_scale": _dynamic(), "max_grad_norm": 1.0, "ema_decay": 0.999},
    "on, ema_every=4": lambda: {"loss_scale": _dynamic(), "max_grad_norm": 1.0, "ema_decay": 0.999, "ema_every": 4},
    "dynamic loss scale": lambda: {"loss_scale": _dynamic()},
    "clipping": lambda: {"max_grad_norm": 1.0},
    "EMA": lambda: {"ema_decay": 0.999},
    "non-finite guard": lambda: {"skip_nonfinite": True},
    "guard + grad norm (app default)": lambda: {"skip_nonfinite": True, "compute_grad_norm": True},
}


def run(settings: Settings) -> List[Row]:
    rows: List[Row] = []
    compile_rows: List[Row] = []
    feature_rows: List[Row] = []
    for name, builder, shape in models(settings):
        steps = settings.small_steps if name == "small_cnn" else settings.large_steps
        inputs = batch_tensors(shape[0], shape[1], shape[2])
        where = setup(name, shape[0], shape[2], steps_per_rep=steps, reps=settings.reps)
        sides = {"baseline": Stepper(_build("baseline", builder), inputs, settings.warmup)}
        # the smoke test compiles only what rows 1-2's bars need; ema_every=4's row is then left out
        configs = list(CONFIGS) if settings.feature_rows else ["off", "on"] + ([] if settings.smoke else
                                                                             ["on, ema_every=4"])
        for config in configs:
            sides[config] = Stepper(_build("wrapper", builder, **CONFIGS[config]()), inputs, settings.warmup)
        seconds = alternate({key: stepper.run(steps) for key, stepper in sides.items()}, settings.reps)
        times = ", ".join(f"{key} {median_ms(seconds[key], steps)}/step" for key in ("baseline", "off", "on"))
        value, spread = ratio(seconds, "off", "baseline")
        rows.append(Row("1", f"wrapper, features off / TrainOneStepCell ({name})", value, "x", "<= 1.02",
                        value <= 1.02, spread, times, where))
        value, spread = ratio(seconds, "on", "baseline")
        rows.append(Row("2", f"wrapper, everything on / TrainOneStepCell ({name})", value, "x", "<= 1.12",
                        value <= 1.12, spread, times + "; on = dynamic loss scale (with its non-finite guard) + "
                        "clipping + EMA, accumulation 1", where))
        if "on, ema_every=4" in seconds:
            value, spread = ratio(seconds, "on, ema_every=4", "baseline")
            rows.append(Row("2", f"wrapper, everything on with ema_every=4 / TrainOneStepCell ({name})", value, "x",
                            "<= 1.06", value <= 1.06, spread,
                            f"{median_ms(seconds['on, ema_every=4'], steps)}/step; the EMA on every 4th step", where))
        for config in [c for c in configs if c not in ("off", "on", "on, ema_every=4")]:
            value, spread = ratio(seconds, config, "baseline")
            feature_rows.append(Row("2", f"wrapper, {config} only / TrainOneStepCell ({name})", value, "x",
                                    "reported", None, spread, f"{median_ms(seconds[config], steps)}/step", where))
        compile_ratio = sides["off"].compile_seconds / sides["baseline"].compile_seconds
        compile_rows.append(Row(
            "8", f"first-step compile, wrapper / TrainOneStepCell ({name})", compile_ratio, "x", "<= 1.3",
            compile_ratio <= 1.3, "one compile each",
            f"wrapper off {sides['off'].compile_seconds:.2f} s, on {sides['on'].compile_seconds:.2f} s, "
            f"TrainOneStepCell {sides['baseline'].compile_seconds:.2f} s", where))
        del sides
    rows.append(_loss_scale_cell(settings))
    rows.extend(feature_rows)
    rows.extend(_accumulation(settings))
    return rows + compile_rows


def _loss_scale_cell(settings: Settings) -> Row:
    """Row 2b: against TrainOneStepWithLossScaleCell where it runs (it does not on CPU in MindSpore 2.10)."""
    name, builder, shape = models(settings)[0]
    inputs = batch_tensors(shape[0], shape[1], shape[2])
    where = setup(name, shape[0], shape[2])
    try:
        cell = Stepper(_build("loss_scale_cell", builder), inputs, settings.warmup)
    except Exception as error:  # noqa: BLE001 -- the message is the result
        lines = [line.strip(" -") for line in str(error).splitlines() if line.strip(" -")]
        reason = " ".join(lines[:2])[:200]
        return Row("2", f"wrapper, everything on / TrainOneStepWithLossScaleCell ({name})", None, "x", "<= 1.0",
                   None, "", f"not measurable here: TrainOneStepWithLossScaleCell fails on "
                   f"{ms.get_context('device_target')} ({reason})", where)
    ours = Stepper(_build("wrapper", builder, **CONFIGS["on"]()), inputs, settings.warmup)
    seconds = alternate({"on": ours.run(settings.small_steps), "cell": cell.run(settings.small_steps)},
                        settings.reps)
    value, spread = ratio(seconds, "on", "cell")
    return Row("2", f"wrapper, everything on / TrainOneStepWithLossScaleCell ({name})", value, "x", "<= 1.0",
               value <= 1.0, spread, "", where)


def _accumulation(settings: Settings) -> List[Row]:
    """Row 3: 4 micro-batches of 8 against one batch of 32, and the `_grad_sum` window's own cost."""
    micro = max(settings.batch // 4, 1)
    builder = models(settings)[1][1]  # ResNet: the accumulation use case (a batch that does not fit)
    image = settings.image
    where = setup(settings.large_model, f"{micro} x 4 vs {micro * 4}", image, reps=settings.reps)
    off = CONFIGS["off"]
    big = Stepper(_build("wrapper", builder, **off()), batch_tensors(micro * 4, 3, image), settings.warmup)
    window = Stepper(_build("wrapper", builder, accumulation_steps=4, **off()), batch_tensors(micro, 3, image),
                     settings.warmup)
    single = Stepper(_build("wrapper", builder, **off()), batch_tensors(micro, 3, image), settings.warmup)
    steps = settings.large_steps
    seconds = alternate({"big": big.run(steps), "window": window.run(4 * steps), "single": single.run(4 * steps)},
                        settings.reps)
    times = (f"batch {micro * 4}: {median_ms(seconds['big'], steps)}/step; micro-batch {micro}: "
             f"{median_ms(seconds['window'], 4 * steps)}/micro-step with accumulation 4, "
             f"{median_ms(seconds['single'], 4 * steps)} without")
    throughput, spread = ratio(seconds, "big", "window")  # equal samples on both sides: time ratio = samples/s
    cost, cost_spread = ratio(seconds, "window", "single")
    return [
        Row("3", "accumulation: samples/s of 4 x 8 / one batch of 32", throughput, "x", "reported", None, spread,
            times, where),
        Row("3", "accumulation window: accumulation_steps=4 / 1 at the same micro-batch", cost, "x", "<= 1.05",
            cost <= 1.05, cost_spread, times, where),
    ]
