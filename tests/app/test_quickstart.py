"""The README's train command (`make train` -> `python -m trainkit`, recipe digits_quickstart) learns the digits."""
from trainkit.app import train
from trainkit.app.config import compose_config


def test_quickstart_recipe_reaches_95_percent_on_the_digits(tmp_path):
    result = train(compose_config([f"run_dir={tmp_path}", "logger.progress=off"]))
    assert result.metrics["accuracy"] >= 0.95 and result.metrics["ema_accuracy"] >= 0.95
    assert result.metrics["optimizer_steps"] == 5 * (1437 // 32)  # 5 epochs of the 80 % training split
    assert type(result.network).__name__ == "SmallCNN" and type(result.data).__name__ == "DigitsData"
