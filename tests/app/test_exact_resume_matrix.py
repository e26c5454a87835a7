"""Exactness over a matrix of features: each case trains uninterrupted, then again stopped by SIGTERM at a step
drawn (seeded) from the middle of the run and continued with trainer.resume=auto. The final checkpoint must be
bitwise the uninterrupted run's, metrics.jsonl equal value by value once wall-clock values are removed, and
best.ckpt's weights equal. A user callback with state (Tally) rides along in every case, so a part dropped from the
registry of stateful parts turns a case red (tests/app/test_exact_resume_parts.py names which).

The digits case with EMA, accumulation and dynamic loss scaling together runs by default; the table, the
image-folder (augmented) and the text case are slow-marked: the same mechanism, other data modules.
"""
import random

import mindspore as ms
import numpy as np
import pytest

from tests.app.test_exact_resume_parts import TALLY, final_arrays, records, same_records, stopped_and_resumed
from tests.common.image_folders import write_folder
from trainkit.app import train
from trainkit.app.config import compose_config

QUIET = ["trainer.test=false", "logger.progress=off", "logger.log_every_n_steps=3"]


def digits(_):
    return ["data.batch_size=64", "data.val_fraction=0.2", "model.width=4", "trainer.epochs=3",
            "wrapper.ema_decay=0.9", "wrapper.accumulation_steps=2", "wrapper.loss_scale=dynamic",
            "wrapper.scale_window=5", "trainer.early_stopping.metric=loss", "trainer.early_stopping.patience=5"]


def table(root):
    rng = np.random.default_rng(1)
    path = root / "t.csv"
    lines = ["x,y,colour,label"] + [f"{x:.3f},{y:.3f},{'red' if x > 0 else 'blue'},{'a' if x + y > 0 else 'b'}"
                                    for x, y in rng.normal(size=(120, 2))]
    path.write_text("\n".join(lines) + "\n")
    return ["data=table", f"data.path={path}", "data.target=label", "data.batch_size=8", "model=mlp",
            "model.hidden_sizes=[4]", "trainer.epochs=3", "wrapper.ema_decay=0.8"]


def image_folder(root):
    folder = write_folder(root / "images", {"a": 14, "b": 14, "c": 14})
    return ["data=image_folder", f"data.root={folder}", "data.image_size=8", "data.batch_size=4",
            "data.augment=light", "data.num_parallel_workers=1", "model.width=4", "trainer.epochs=2"]


def text(root):
    """data=text: its tokenizer trained again by the resumed process (another process's hash seeds) must be the
    same, and the batches' order continue; TextBag's dropout rides along."""
    generator = random.Random(1)
    words = ["good", "bad", "film", "plot", "very", "not", "the", "acting", "warm", "cold"]
    path = root / "t.csv"
    rows = [" ".join(generator.choice(words) for _ in range(generator.randint(2, 9))) for _ in range(90)]
    path.write_text("text,label\n" + "".join(f"{row},{'pos' if 'good' in row else 'neg'}\n" for row in rows))
    return ["recipe=text_classification", f"data.path={path}", "data.max_length=8", "data.batch_size=8",
            "data.vocab_size=60", "model.embed_dim=8", "model.hidden_sizes=[4]", "model.dropout=0.2",
            "trainer.epochs=3", "wrapper.ema_decay=0.8"]


@pytest.mark.parametrize("case", [
    digits,
    pytest.param(table, marks=pytest.mark.slow),
    pytest.param(image_folder, marks=pytest.mark.slow),
    pytest.param(text, marks=pytest.mark.slow),
], ids=lambda case: case.__name__)
def test_a_run_stopped_at_a_drawn_step_and_resumed_ends_as_the_uninterrupted_one(tmp_path, case):
    common = [*case(tmp_path), *QUIET]
    whole = train(compose_config([*common, f"run_dir={tmp_path / 'whole'}", f"callbacks=[{TALLY}]"]))
    total = int(whole.metrics["optimizer_steps"]) * int(whole.wrapper.accumulation_steps)
    steps = whole.data.train_dataset().get_dataset_size()
    # a step inside an epoch, never an epoch's last (the stop there is at the epoch's end: another path, also fine)
    candidates = [s for s in range(2, total - 1) if s % steps]
    step = random.Random(case.__name__).choice(candidates)
    stopped_and_resumed(common, tmp_path / "resumed", step, user=[TALLY])
    name, expected = final_arrays(tmp_path / "whole")
    name_resumed, got = final_arrays(tmp_path / "resumed")
    assert name_resumed == name
    differing = [k for k in expected if not np.array_equal(expected[k], got[k])]
    assert not differing, f"stopped at step {step}: {differing[:5]}"
    same_records(records(tmp_path / "resumed"), records(tmp_path / "whole"))
    def best_of(run):
        saved = ms.load_checkpoint(str(tmp_path / run / "checkpoints" / "best.ckpt"))
        return {k: v.asnumpy() for k, v in saved.items() if hasattr(v, "asnumpy")}

    best, best_resumed = best_of("whole"), best_of("resumed")
    assert all(np.array_equal(best[k], best_resumed[k]) for k in best)
