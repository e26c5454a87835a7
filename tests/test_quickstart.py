"""The README's train command (`make train` -> trainkit.quickstart) runs and learns."""
from trainkit import quickstart


def test_quickstart_trains_and_reports_live_and_ema_accuracy(graph_mode, capsys):
    result = quickstart.main(["--epochs", "1"])
    micro_batches = 4096 // 32
    assert result["optimizer_steps"] == micro_batches // 2  # accumulation_steps=2
    assert result["accuracy"] > 0.6 and result["ema_accuracy"] > 0.5  # four classes: chance is 0.25
    assert "test accuracy" in capsys.readouterr().out
