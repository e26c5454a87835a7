"""Exactness over a matrix of features, as a property: each case trains uninterrupted, then again stopped at a
micro-batch drawn (seeded by the case's name) from the middle of the run -- by SIGTERM (a polite stop, a checkpoint
there) and by SIGKILL (nothing more written: the run continues from the newest periodic checkpoint it left) -- and is
continued with trainer.resume=auto. The final checkpoint must be bitwise the uninterrupted run's, metrics.jsonl equal
value by value once wall-clock values are removed, the early-stopping marker (the stop epoch) and best.ckpt equal.

A user callback with state (Tally) rides along in every case. The cases: digits with early stopping, EMA,
accumulation and dynamic loss scaling together; a table (an MLP with dropout: a random stream); an image folder
augmented with `light` and with `randaugment` (trainkit's seeded ops); a text classifier (its tokenizer
trained again by the resumed process); 2 data-parallel workers under msrun.

The mutation test leaves one part out of the resume at a time -- each name the registry of stateful parts reports
(a new one is parametrized without an edit), each group of Parameters the checkpoint holds outside it (weights,
optimizer, EMA, loss scale, accumulation window, running totals, a dropout's random stream) and the data position --
and the comparison must then fail. The registry's `data` and `best_checkpoint` are taken again from the run's own
files, so an exact resume with those intact must stay equal without them (REDERIVED below).

By default: digits by SIGTERM and by SIGKILL, and two mutations (train_metrics, callbacks/Tally): about 30 s at a
load of 10 on 2 cores. The rest is slow-marked (`-m slow`: about 4 min more).
"""
import json
import logging
import random
import re
import signal
from dataclasses import dataclass
from typing import Callable

import mindspore as ms
import numpy as np
import pytest

from tests.app.stateful_callbacks import Tally
from tests.app.test_exact_resume_parts import (
    TALLY,
    callbacks,
    differences,
    final_position,
    kill_at,
    killed_and_resumed,
    records,
    stop_at,
    stopped_and_resumed,
    trainkit_process,
)
from tests.common.image_folders import write_folder
from trainkit.app import build, run, train
from trainkit.app.config import compose_config
from trainkit.app.run_loop import DATA_PART
from trainkit.rundir.stateful_parts import StatefulParts
from trainkit.step.running_totals import RUNNING_TOTALS

LOG_EVERY, EVERY = 3, 4  # a record every 3 micro-batches, a checkpoint every 4
QUIET = ["trainer.test=false", "logger.progress=off", f"logger.log_every_n_steps={LOG_EVERY}",
         f"trainer.checkpoint_every_n_steps={EVERY}", "trainer.keep_checkpoints=3"]


def digits(_):
    """min_delta beyond any change of the loss: only epoch 1 improves, so patience 2 stops the run after epoch 3
    of 4 (the stop epoch is compared)."""
    return ["data.batch_size=64", "data.val_fraction=0.2", "model.width=4", "trainer.epochs=4",
            "wrapper.ema_decay=0.9", "wrapper.accumulation_steps=2", "wrapper.loss_scale=dynamic",
            "wrapper.scale_window=5", "trainer.early_stopping.metric=loss", "trainer.early_stopping.patience=2",
            "trainer.early_stopping.min_delta=100"]


def table(root):
    rng = np.random.default_rng(1)
    path = root / "t.csv"
    lines = ["x,y,colour,label"] + [f"{x:.3f},{y:.3f},{'red' if x > 0 else 'blue'},{'a' if x + y > 0 else 'b'}"
                                    for x, y in rng.normal(size=(120, 2))]
    path.write_text("\n".join(lines) + "\n")
    return ["data=table", f"data.path={path}", "data.target=label", "data.batch_size=8", "model=mlp",
            "model.hidden_sizes=[4]", "model.dropout=0.2", "trainer.epochs=3", "wrapper.ema_decay=0.8"]


def image_folder(augment):
    def case(root):
        folder = root / "images"
        if not folder.exists():
            write_folder(folder, {"a": 14, "b": 14, "c": 14})
        return ["data=image_folder", f"data.root={folder}", "data.image_size=8", "data.batch_size=4",
                f"data.augment={augment}", "data.num_parallel_workers=1", "model.width=4", "trainer.epochs=2"]

    case.__name__ = f"image_folder_{augment}"
    return case


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


def two_workers(_):
    return ["data.batch_size=32", "data.val_fraction=0.2", "model.width=4", "trainer.epochs=2",
            "wrapper.accumulation_steps=2", "wrapper.ema_decay=0.9", "parallel=data_parallel", "parallel.workers=2"]


@dataclass(frozen=True)
class Case:
    overrides: Callable
    parallel: bool = False  # every run through `python -m trainkit` (msrun starts the workers)

    @property
    def name(self) -> str:
        return self.overrides.__name__


CASES = {case.name: case for case in [Case(digits), Case(table), Case(image_folder("light")),
                                       Case(image_folder("randaugment")), Case(text),
                                       Case(two_workers, parallel=True)]}
SLOW = {"table", "image_folder_light", "image_folder_randaugment", "text", "two_workers"}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """name -> (the case's overrides, its uninterrupted run's directory), each trained once for the module."""
    runs = {}
    root = tmp_path_factory.mktemp("matrix")

    def get(case: Case):
        if case.name not in runs:
            folder = root / case.name
            folder.mkdir()
            common = [*case.overrides(folder), *QUIET]
            whole = folder / "whole"
            if case.parallel:
                done = trainkit_process([*common, f"hydra.run.dir={whole}", callbacks(TALLY)], folder, module=True)
                assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
            else:
                train(compose_config([*common, f"run_dir={whole}", callbacks(TALLY)]))
            runs[case.name] = common, whole
        return runs[case.name]

    return get


def drawn_step(case_name: str, whole, later_than: int = 0, window: int = 1, killed: bool = False) -> int:
    """A micro-batch drawn from the run (seeded by the case): inside an epoch and inside a record interval (and an
    accumulation `window`), the demanding stop; a stop at an epoch's last step is another path, test_resume.py's.
    `killed`: a step with a record between it and the periodic checkpoint before it, which the continuation
    must set aside and write again."""
    total, steps = final_position(whole)

    def records_after_checkpoint(s):
        checkpoint = max(s // EVERY * EVERY, s // steps * steps)
        return any(r % LOG_EVERY == 0 for r in range(checkpoint + 1, s + 1))

    candidates = [s for s in range(max(2, later_than + 1), total - 1)
                  if s % steps and s % LOG_EVERY and (window == 1 or s % window)
                  and (not killed or records_after_checkpoint(s))]
    return random.Random(case_name).choice(candidates)


def interrupted(case: Case, common, run_dir, how: signal.Signals, step: int):
    """The case stopped by `how` at `step`, then continued with trainer.resume=auto to its end."""
    if not case.parallel:
        if how == signal.SIGTERM:
            return stopped_and_resumed(common, run_dir, step, user=[TALLY])
        return killed_and_resumed(common, run_dir, step, user=[TALLY])
    stopper = stop_at(step) if how == signal.SIGTERM else kill_at(step)
    args = [*common, f"hydra.run.dir={run_dir}"]
    stopped = trainkit_process([*args, callbacks(TALLY, stopper)], run_dir.parent, module=True)
    assert stopped.returncode != 0, stopped.stdout[-3000:]
    worker = (run_dir / "msrun_logs" / "worker_0.log").read_text()
    assert "finished:" not in worker
    if how == signal.SIGTERM:
        assert "stopped by SIGTERM after step" in worker, worker[-3000:]  # the ranks agree on a step >= `step`
    resumed = trainkit_process([*args, "trainer.resume=auto", callbacks(TALLY)], run_dir.parent, module=True)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL], ids=lambda s: s.name)
@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.slow) if name in SLOW else name
                                  for name in CASES])
def test_a_run_stopped_at_a_drawn_step_and_resumed_ends_as_the_uninterrupted_one(uninterrupted, caplog, name, how):
    case = CASES[name]
    common, whole = uninterrupted(case)
    # a kill after the first periodic checkpoint's step: usually continued from one (if the kill comes before the
    # background write is done, from an earlier one or from the start, as after any crash)
    killed = how == signal.SIGKILL
    step = drawn_step(f"{name}-{how.name}", whole, later_than=EVERY + 1 if killed else 0, killed=killed)
    run_dir = whole.parent / f"resumed-{how.name}"
    caplog.set_level(logging.INFO, logger="trainkit")
    interrupted(case, common, run_dir, how, step)
    assert not differences(whole, run_dir), (f"stopped by {how.name} at step {step}", differences(whole, run_dir))
    if how == signal.SIGKILL:  # the killed attempt's records after the checkpoint it resumed from were set aside
        log = (run_dir / "train.log").read_text() if case.parallel else caplog.text
        resumed = re.findall(r"resuming from \S+: .*?\((\d+) micro-batches done", log)
        resumed_at = int(resumed[-1]) if resumed else -1  # none complete: every record is made again
        assert resumed_at < step
        aside = [json.loads(line)["step"] for path in sorted(run_dir.glob("metrics.superseded-*.jsonl"))
                 for line in path.read_text().splitlines()]
        assert aside == [r["step"] for r in records(whole) if resumed_at < r["step"] <= step]


# ----------------------------------------------------------------------------------------------- mutations
#: The names trainkit's registry of stateful parts reports: the data module's fitted state, trainkit's own parts
#: (each with a check of a stored state) and the user callbacks it registers (Tally). A part added to those is
#: parametrized below without an edit here; one registered otherwise turns the guard test at the end red.
REGISTERED = [DATA_PART, *build.OWN_PART_CHECKS, *build.user_parts([Tally()]).names()]


def _leaf(name: str) -> str:
    return name.rsplit(".", 1)[-1]


#: State a checkpoint holds outside the registry, as Parameters of the TrainingWrapper, in groups a resume can leave
#: out (each left as a new run has it); "weights" is every Parameter no other group takes.
PARAMETER_GROUPS = {
    "optimizer": lambda name: name.startswith(("optimizer.", "moment", "global_step", "beta", "_unused_beta")),
    "ema": lambda name: name.startswith("ema"),
    "loss_scale": lambda name: name.startswith("loss_scale"),
    "accumulation": lambda name: name.startswith(("_grad_sum", "micro_step", "_window_start")),
    "running_totals": lambda name: name in RUNNING_TOTALS or name == "_loss_sum",
    "random_streams": lambda name: _leaf(name) in ("calls", "dropout_calls"),  # trainkit.models.dropout.Dropout
}
PARAMETER_GROUPS["weights"] = lambda name: not any(group(name) for key, group in PARAMETER_GROUPS.items()
                                                   if key != "weights")
#: Each mutation and the case it turns red: the digits case has every part but a random stream (the table's MLP
#: dropout has one). The data position is the checkpoint's micro-batches done, which place the data pipeline.
MUTATIONS = {**{part: "digits" for part in [*REGISTERED, *PARAMETER_GROUPS, "data_position"]},
             "random_streams": "table"}
DEFAULT_MUTATIONS = {"train_metrics", "callbacks/Tally"}
#: Parts an exact resume with the run's files intact does not need, since their state is derived again from those
#: files: dropping them must leave the comparison equal (their purpose is a run whose files changed or went
#: missing; tests/app/test_exact_resume_parts.py and the run loop's tests hold that). Any other part must turn it red.
REDERIVED = {DATA_PART: "the data module fits the same state again from the same files",
             "best_checkpoint": "BestCheckpoint reads the best so far back from best.json beside best.ckpt"}


def drop(monkeypatch, part: str) -> None:
    """The resume leaves `part` as a new run has it: what a registry missing it would do."""
    if part in REGISTERED:
        load = StatefulParts.load

        def without(self, stored, source, *args, **kwargs):
            return load(self, {k: v for k, v in (stored or {}).items() if k != part}, source, *args, **kwargs)

        monkeypatch.setattr(StatefulParts, "load", without)
    elif part == "data_position":
        monkeypatch.setattr(ms.dataset.Dataset, "set_init_step", lambda self, step: None)
    else:
        def restore(checkpoint, network):
            kept = {k: v for k, v in checkpoint.parameters.items() if not PARAMETER_GROUPS[part](k)}
            assert len(kept) < len(checkpoint.parameters), f"the checkpoint holds no Parameter of the group {part}"
            ms.load_param_into_net(network, kept)

        monkeypatch.setattr(run, "restore", restore)


@pytest.mark.parametrize("part", [part if part in DEFAULT_MUTATIONS else pytest.param(part, marks=pytest.mark.slow)
                                  for part in MUTATIONS])
def test_a_part_left_out_of_the_resume_turns_the_comparison_red(uninterrupted, monkeypatch, part):
    """Stopped by SIGTERM after the first epoch (early stopping's best is set), inside a record interval and an
    accumulation window: every part has state there that the uninterrupted run goes on with (REDERIVED: state the
    run takes again from its files, which the comparison must find equal)."""
    common, whole = uninterrupted(CASES[MUTATIONS[part]])
    if part in REGISTERED:
        assert part in stored_parts(whole), "the registry reports a part no checkpoint of the run holds"
    _, steps = final_position(whole)
    step = drawn_step(f"mutation-{part}", whole, later_than=steps, window=2)
    drop(monkeypatch, part)
    run_dir = whole.parent / f"mutated-{part.replace('/', '-')}"
    stopped_and_resumed(common, run_dir, step, user=[TALLY])
    found = differences(whole, run_dir)
    print(f"{part} left out of the resume after step {step}:", *found[:3], sep="\n  ")
    if part in REDERIVED:
        assert not found, f"{part} now matters for an exact resume (move it out of REDERIVED): {found[:3]}"
    else:
        assert found, f"{part} left out of the resume after step {step}: still equal"


def stored_parts(run_dir):
    """The names of the parts the run's newest checkpoint holds state for."""
    return set(json.loads(str(newest_checkpoint(run_dir)["trainkit_parts"])))


def newest_checkpoint(run_dir):
    newest = max((run_dir / "checkpoints").glob("trainkit-*.ckpt"), key=lambda p: p.stat().st_mtime)
    return ms.load_checkpoint(str(newest))


def test_the_mutations_name_every_part_a_checkpoint_holds(uninterrupted):
    """The parts a checkpoint of the digits case holds state for are the ones the registry reports (so each is
    mutated above), and each group of Parameters the mutations drop has members there."""
    _, whole = uninterrupted(CASES["digits"])
    assert stored_parts(whole) == set(REGISTERED)
    names = [k for k, v in newest_checkpoint(whole).items() if isinstance(v, ms.Parameter)]
    empty = [key for key, group in PARAMETER_GROUPS.items() if key != "random_streams" and not any(map(group, names))]
    assert not empty, (empty, names)
