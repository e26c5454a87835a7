"""Exact resume of the state that lives outside Parameters: early stopping, a user callback's own state and the
records' interval continue after a polite stop (SIGTERM) as if the run had never stopped; best.ckpt carries its
run's config; a table run predicts without its training file.

Each uninterrupted run is compared with the same command stopped mid-epoch by SIGTERM (sent by a callback at a
chosen step, so the stop is at a known step however loaded the machine) and continued with trainer.resume=auto:
the final checkpoint bitwise, metrics.jsonl value by value once wall-clock values are removed, the stop epoch.
The helpers (a stop by SIGTERM or by SIGKILL at a step, the comparison) serve test_exact_resume_matrix.py too.
"""
import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest

from trainkit.app import train
from trainkit.app.config import compose_config
from trainkit.errors import RunInterrupted
from trainkit.rundir.class_names import load_class_names
from trainkit.rundir.data_state import load_data_state
from trainkit.rundir.stateful_parts import parts_of

TALLY = "{_target_:tests.app.stateful_callbacks.Tally}"
WALL_CLOCK = ("time", "train/samples_per_second")
REPO = Path(__file__).resolve().parents[2]
#: ``train(compose_config(argv))`` in a process of its own: the in-process path, for a run the test kills.
TRAIN = "import sys; from trainkit.app import train; from trainkit.app.config import compose_config; " \
        "train(compose_config(sys.argv[1:]))"


def stop_at(step):
    return f"{{_target_:tests.app.stateful_callbacks.StopAt,step:{step}}}"


def kill_at(step):
    return f"{{_target_:tests.app.stateful_callbacks.KillAt,step:{step}}}"


def callbacks(*entries):
    return f"callbacks=[{', '.join(entries)}]"


def trainkit_process(args, cwd, module=False, timeout=900):
    """`args` trained in a new process (``python -m trainkit`` with `module`, else :data:`TRAIN`)."""
    env = {**os.environ, "GLOG_v": "3", "PYTHONPATH": str(REPO)}
    command = [sys.executable, *(["-m", "trainkit"] if module else ["-c", TRAIN]), *args]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def killed_and_resumed(common, run_dir, step, user=()):
    """`common` killed by SIGKILL at the end of micro-batch `step` (in a process of its own), then continued
    in-process with trainer.resume=auto: from the newest checkpoint the killed run left complete."""
    done = trainkit_process([*common, f"run_dir={run_dir}", callbacks(*user, kill_at(step))], run_dir.parent)
    assert done.returncode == -signal.SIGKILL, done.stderr[-3000:]
    return train(compose_config([*common, f"run_dir={run_dir}", "trainer.resume=auto", callbacks(*user)]))


def scalar_entry(saved, key):
    return int(saved[key].asnumpy().item())


def final_position(run_dir):
    """(micro-batches done, per epoch) of the run's newest checkpoint: where the run ended."""
    newest = sorted((run_dir / "checkpoints").glob("trainkit-*.ckpt"), key=lambda p: p.stat().st_mtime)[-1]
    saved = ms.load_checkpoint(str(newest))
    return scalar_entry(saved, "micro_steps"), scalar_entry(saved, "steps_per_epoch")


def differences(whole, resumed):
    """What differs between an uninterrupted run directory and a stopped-and-resumed one, as lines (none: equal):
    the final checkpoint bitwise, metrics.jsonl value by value without wall-clock values, the early-stopping
    marker (the stop epoch), best.ckpt's arrays and best.json's metric, value, epoch and step."""
    found = []
    name, expected = final_arrays(whole)
    name_resumed, got = final_arrays(resumed)
    if name != name_resumed:
        found.append(f"final checkpoint {name_resumed}, expected {name}")
    found += [f"{name}: {k} differs" for k in sorted(set(expected) | set(got))
              if k not in expected or k not in got or not np.array_equal(expected[k], got[k])][:5]
    try:
        same_records(records(resumed), records(whole))
    except AssertionError as error:
        found.append(f"metrics.jsonl: {str(error)[:300]}")
    for marker in ("early_stopped.json", "best.json"):
        paths = [run / "checkpoints" / marker for run in (whole, resumed)]
        texts = [json.loads(p.read_text()) if p.exists() else None for p in paths]
        if marker == "best.json":  # its crc32 is of a file that holds the run's own config (its run_dir)
            texts = [text and {k: text.get(k) for k in ("metric", "mode", "value", "epoch", "step")}
                     for text in texts]
        if texts[0] != texts[1]:
            found.append(f"{marker}: {texts[1]}, expected {texts[0]}")
    bests = [run / "checkpoints" / "best.ckpt" for run in (whole, resumed)]
    if bests[0].exists():
        best, best_resumed = (arrays_of(path) if path.exists() else {} for path in bests)
        found += [f"best.ckpt: {k} differs" for k in best
                  if k not in best_resumed or not np.array_equal(best[k], best_resumed[k])][:5]
    return found


def arrays_of(path):
    return {k: v.asnumpy() for k, v in ms.load_checkpoint(str(path)).items() if hasattr(v, "asnumpy")}


def records(run_dir):
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k not in WALL_CLOCK} for line in lines]


def same_records(a, b):
    assert [r["step"] for r in a] == [r["step"] for r in b]
    for left, right in zip(a, b):
        assert left.keys() == right.keys(), (left, right)
        for key in left:
            x, y = left[key], right[key]
            assert x == y or (isinstance(x, float) and math.isnan(x) and math.isnan(y)), (left["step"], key, x, y)


def final_arrays(run_dir):
    newest = sorted((run_dir / "checkpoints").glob("trainkit-*.ckpt"), key=lambda p: p.stat().st_mtime)[-1]
    return newest.name, arrays_of(newest)


def stopped_and_resumed(common, run_dir, step, user=()):
    with pytest.raises(RunInterrupted):
        train(compose_config([*common, f"run_dir={run_dir}", f"callbacks=[{', '.join([*user, stop_at(step)])}]"]))
    return train(compose_config([*common, f"run_dir={run_dir}", "trainer.resume=auto",
                                 f"callbacks=[{', '.join(user)}]"]))


DIGITS = ["data.batch_size=128", "data.val_fraction=0.2", "trainer.test=false", "logger.progress=off",
          "logger.log_every_n_steps=4", "model.width=4"]
EARLY = [*DIGITS, "trainer.epochs=6", "trainer.early_stopping.metric=loss", "trainer.early_stopping.patience=2",
         "trainer.early_stopping.min_delta=100"]


@pytest.fixture(scope="module")
def early(tmp_path_factory):
    """min_delta larger than any change of the loss: only the first evaluation improves, so with patience 2 the
    run stops after epoch 3 of 6. Stopped by SIGTERM in epoch 3, after one evaluation without improvement."""
    common = EARLY
    root = tmp_path_factory.mktemp("early")
    whole = train(compose_config([*common, f"run_dir={root / 'whole'}", f"callbacks=[{TALLY}]"]))
    steps = whole.data.train_dataset().get_dataset_size()
    resumed = stopped_and_resumed(common, root / "resumed", 2 * steps + 2, user=[TALLY])
    return root, whole, resumed, steps


def test_early_stopping_continues_its_count_after_a_resume(early):
    """Mutation caught: EarlyStopping left out of the registry (the resumed run starts its count again at epoch 3
    and stops after epoch 5)."""
    root, whole, resumed, steps = early
    assert whole.metrics["stopped_epoch"] == 3 and whole.metrics["best_epoch"] == 1
    assert resumed.metrics["stopped_epoch"] == whole.metrics["stopped_epoch"]
    assert resumed.metrics["best_epoch"] == whole.metrics["best_epoch"]
    assert json.loads((root / "resumed" / "checkpoints" / "early_stopped.json").read_text())["step"] == 3 * steps


def test_the_final_checkpoint_and_the_records_equal_the_uninterrupted_runs(early):
    """The records' interval goes on across the stop (log_every_n_steps=4 does not divide the stop step): no
    extra record at the stop step, and the first train/loss after it averages the whole interval. Mutations
    caught: TrainMetrics left out of the registry; a record at a stop mid-epoch."""
    root = early[0]
    name, whole = final_arrays(root / "whole")
    name_resumed, resumed = final_arrays(root / "resumed")
    assert name == name_resumed and whole.keys() == resumed.keys()
    assert all(np.array_equal(whole[k], resumed[k]) for k in whole)
    same_records(records(root / "resumed"), records(root / "whole"))


def test_a_user_callbacks_state_continues_after_a_resume(early):
    """Tally counts the steps it saw and the lowest evaluation loss: its logged values equal the uninterrupted
    run's (mutation caught: user callbacks not registered, its count restarts at 0)."""
    root, whole, _, steps = early
    seen = [(r["step"], r["custom/steps_seen"]) for r in records(root / "resumed") if "custom/steps_seen" in r]
    assert seen == [(e * steps, e * steps) for e in range(1, 4)]
    lowest = [r["custom/lowest_loss"] for r in records(root / "resumed") if "custom/lowest_loss" in r]
    losses = [r["eval/loss"] for r in records(root / "whole") if "eval/loss" in r]
    assert lowest == list(np.minimum.accumulate(losses))  # NumPy's running minimum of the recorded losses


def test_a_callback_whose_state_is_not_json_stops_the_run_before_it_compiles_in_one_line(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    env = {"PYTHONPATH": str(Path(__file__).resolve().parents[2]), "PATH": "/usr/bin:/bin", "GLOG_v": "3"}
    callback = "callbacks=[{_target_:tests.app.stateful_callbacks.KeepsAnObject}]"
    done = subprocess.run([sys.executable, "-m", "trainkit", "trainer.epochs=1", "logger.progress=off",
                           f"run_dir={tmp_path / 'run'}", callback],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1].startswith(
        "trainkit: error: KeepsAnObject.state_dict() (part callbacks/KeepsAnObject) is not JSON data")
    assert "Traceback" not in done.stderr and not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.parametrize("planted", [{"bad_evaluations": -1000}, {"best": "abc"}, {"bad_evaluations": True}])
def test_a_planted_part_state_is_one_line_and_the_new_run_directory_stays_unwritten(early, tmp_path, planted):
    """A checkpoint is data someone may have made: early stopping's state of another type or range is refused
    before anything is written (it was taken with exit 0: -1000 evaluations without improvement)."""
    from trainkit.errors import ConfigError

    root, _, _, steps = early
    target = planted_checkpoint(root / "whole" / "checkpoints" / f"trainkit-2_{steps}.ckpt", tmp_path / "planted.ckpt",
                                "early_stopping", planted)
    run_dir = tmp_path / "run"
    with pytest.raises(ConfigError, match=f"the stored state of early_stopping does not fit this run's EarlyStopping "
                                          f".*{next(iter(planted))}"):
        train(compose_config([*EARLY, f"run_dir={run_dir}", f"trainer.resume={target}"]))
    assert not [p for p in run_dir.rglob("*") if p.name in ("metrics.jsonl", "config.yaml", "train.log")]


def planted_checkpoint(source, target, part, values):
    """`source` written again as `target` with `values` planted in the stored state of `part`."""
    saved = ms.load_checkpoint(str(source))
    texts = {key: value for key, value in saved.items() if isinstance(value, str)}
    numbers = ("micro_steps", "steps_per_epoch", "skipped_steps", "group_size")
    append = {**texts, **{key: int(saved[key].asnumpy().item()) for key in numbers}}
    parts = json.loads(append["trainkit_parts"])
    parts[part].update(values)
    append["trainkit_parts"] = json.dumps(parts)
    ms.save_checkpoint([{"name": k, "data": v} for k, v in saved.items() if k not in append], str(target),
                       append_dict=append, crc_check=True)
    return target


def stored_parts(run_dir):
    newest = sorted((run_dir / "checkpoints").glob("trainkit-*.ckpt"), key=lambda p: p.stat().st_mtime)[-1]
    return parts_of(ms.load_checkpoint(str(newest)), str(newest))


def test_best_ckpts_best_and_the_data_are_parts_of_every_checkpoint(early):
    """The registry assembles the checkpoint: best.ckpt's best so far (as best.json has it at the end) and the
    data's fitted state and class names are in the final checkpoint, equal in the uninterrupted and the resumed
    run. Mutations caught: BestCheckpoint, or the data's fitted state, left out of the registry."""
    root = early[0]
    whole, resumed = stored_parts(root / "whole"), stored_parts(root / "resumed")
    info = json.loads((root / "whole" / "checkpoints" / "best.json").read_text())
    assert whole["best_checkpoint"] == resumed["best_checkpoint"] == {
        "metric": info["metric"], "mode": info["mode"], "best": info["value"], "best_epoch": info["epoch"],
        "best_step": info["step"]}
    assert whole["data"] == resumed["data"] == {"state": load_data_state(root / "whole"),
                                                "class_names": load_class_names(root / "whole")}


def test_a_checkpoint_of_other_data_is_refused_before_anything_is_written(early, tmp_path):
    """A checkpoint whose run's data module fitted other class names (the training data changed since) is refused in
    one line naming the part, and the new run directory stays unwritten."""
    from trainkit.errors import ConfigError

    root, _, _, steps = early
    target = planted_checkpoint(root / "whole" / "checkpoints" / f"trainkit-2_{steps}.ckpt", tmp_path / "other.ckpt",
                                "data", {"class_names": ["cat", "dog"]})
    run_dir = tmp_path / "run"
    with pytest.raises(ConfigError, match="the stored state of data does not fit this run's data module .*class names"):
        train(compose_config([*EARLY, f"run_dir={run_dir}", f"trainer.resume={target}"]))
    assert not [p for p in run_dir.rglob("*") if p.name in ("metrics.jsonl", "config.yaml", "train.log")]
