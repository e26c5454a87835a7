"""The README's train command (`make train` -> `python -m trainkit`, recipe digits_quickstart) learns the digits."""
from trainkit.app import train
from trainkit.app.config import compose_config


def test_quickstart_recipe_reaches_95_percent_on_the_digits(tmp_path):
    result = train(compose_config([f"run_dir={tmp_path}", "logger.progress=off"]))
    assert result.metrics["accuracy"] >= 0.95 and result.metrics["ema_accuracy"] >= 0.95
    assert result.metrics["test_accuracy"] >= 0.95  # the held-out test set, with best.ckpt's weights
    # 5 epochs of the training split: 1,797 digits less 20 % test and 10 % validation per class (1,257)
    assert result.metrics["optimizer_steps"] == 5 * (1257 // 32)
    assert type(result.network).__name__ == "SmallCNN" and type(result.data).__name__ == "DigitsData"
