"""The run's step arithmetic (trainkit.app.plan.StepPlan) against counts written out by hand, over a seeded range of
runs: micro-batches, updates, sinks and Model.train's epochs."""
import random

from trainkit.app.plan import StepPlan


def test_the_counts_follow_from_epochs_steps_windows_and_sinks():
    rng = random.Random(0)
    for _ in range(300):
        epochs, steps, k = rng.randrange(1, 50), rng.randrange(1, 400), rng.randrange(1, 9)
        sink = rng.choice([-1, 0, *[d for d in range(1, steps + 1) if steps % d == 0]])
        plan = StepPlan(epochs=epochs, steps_per_epoch=steps, accumulation_steps=k, sink_size=sink)
        micro = sum(steps for _ in range(epochs))
        assert plan.micro_steps == micro
        assert plan.updates == len(range(k, micro + 1, k))  # the windows that complete
        sinks = steps // sink if sink > 0 else 1
        assert plan.sinks_per_epoch == sinks and plan.model_epochs == epochs * sinks
