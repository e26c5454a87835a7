"""bench.port_zoo's workers (bench/fork_jobs.py) and its model built once: jobs run side by side unless their
memory says not, a dead or stuck worker leaves a row saying so, and a worker's port writes the bytes the earlier
flow (weights saved to a file, the model built again and loading them, torch's and MindSpore's defaults) wrote.
No timing is asserted."""
import functools
import os
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from bench import port_zoo
from bench.fork_jobs import Job, run_jobs


def _meet(folder: Path, name: str, patience: float, keep: bool) -> bool:
    """Mark `name` running in `folder`, wait up to `patience` s for another job's mark: whether one was seen. The
    mark stays when `keep` (the others see that this job ran), else it goes when the job ends."""
    mark = folder / f"{name}.running"
    mark.touch()
    try:
        end = time.monotonic() + patience
        while time.monotonic() < end:
            if any(path != mark for path in folder.glob("*.running")):
                return True
            time.sleep(0.02)
        return False
    finally:
        if not keep:
            mark.unlink()


def test_jobs_run_side_by_side_and_give_back_what_they_return(tmp_path):
    jobs = [Job(name, 1.0, functools.partial(_meet, tmp_path, name, 20.0, True)) for name in ("a", "b")]
    outcomes = run_jobs(jobs, parallel=2, memory=2.0)
    assert {name: outcome.value for name, outcome in outcomes.items()} == {"a": True, "b": True}
    assert all(outcome.problem == "" and outcome.peak > 0 for outcome in outcomes.values())


def test_a_job_waits_while_the_running_ones_would_leave_it_too_little_memory(tmp_path):
    jobs = [Job(name, 1.5, functools.partial(_meet, tmp_path, name, 0.3, False)) for name in ("a", "b", "c")]
    outcomes = run_jobs(jobs, parallel=3, memory=2.0)
    assert [outcomes[name].value for name in "abc"] == [False, False, False]


def test_a_job_larger_than_the_memory_still_runs_alone(tmp_path):
    outcomes = run_jobs([Job("big", 5.0, lambda: 7)], parallel=2, memory=2.0)
    assert outcomes["big"].value == 7


def _die():
    os.kill(os.getpid(), signal.SIGKILL)


def _fail():
    raise RuntimeError("a bug")


def test_a_killed_a_failing_and_a_stuck_job_say_so_and_the_others_finish():
    finished = []
    outcomes = run_jobs([Job("killed", 0, _die), Job("fails", 0, _fail),
                         Job("stuck", 0, functools.partial(time.sleep, 20)), Job("fine", 0, lambda: "row")],
                        parallel=2, timeout=1.0, finished=finished.append)
    assert outcomes["killed"].problem == "killed by SIGKILL (out of memory?)"
    assert outcomes["fails"].problem.startswith("its process exited with status 1")
    assert outcomes["stuck"].problem == "stopped after 1 s (--timeout)" and outcomes["stuck"].value is None
    assert outcomes["fine"].value == "row"
    assert sorted(outcome.name for outcome in finished) == ["fails", "fine", "killed", "stuck"]


def test_jobs_not_started_by_the_deadline_are_listed_not_run():
    outcomes = run_jobs([Job("late", 0, lambda: 1)], deadline=time.perf_counter() - 1)
    assert outcomes["late"].seconds is None and outcomes["late"].problem.startswith("not started")
    assert port_zoo._row(outcomes["late"], 60).ported == "not run: the table's time budget (60 s) was spent"


def test_built_once_returns_the_model_for_its_arguments_once_and_keeps_the_factory_s_signature(monkeypatch):
    module = types.ModuleType("zoo_factories")

    def make(*, width: int = 3, depth: int = 2):
        return ("built", width, depth)

    module.make = make
    monkeypatch.setitem(sys.modules, "zoo_factories", module)
    import inspect

    with port_zoo.built_once("zoo_factories:make", {"width": 4}, "the model"):
        assert inspect.signature(module.make) == inspect.signature(make)
        assert module.make(width=5) == ("built", 5, 2)  # other arguments (port's rebuilds): the factory's own
        assert module.make(width=4) == "the model"
        assert module.make(width=4) == ("built", 4, 2)  # once
    assert module.make is make


def test_bad_options_are_one_line_naming_them(capsys):
    for argv, named in ((["--jobs", "0"], "--jobs 0"), (["--threads", "-1"], "--threads -1"),
                        (["--memory", "-1"], "--memory -1")):
        with pytest.raises(SystemExit) as stop:
            port_zoo.main(argv)
        assert stop.value.code == 2
        assert f"error: {named}: give" in capsys.readouterr().err


def test_rows_of_earlier_runs_are_taken_with_or_without_the_onnx_column(tmp_path):
    """A table from before the ONNX column still feeds --rows-from; a later log's row of a model replaces it; a later
    run too small for a model keeps its earlier port and says why its ONNX cell is empty.

    Mutation caught: the later 'not run' row dropped without a word (the ONNX cell stays 'a row from before')."""
    old, new = tmp_path / "old.md", tmp_path / "new.log"
    old.write_text("| model | ported | agrees | seconds |\n|---|---|---|---|\n"
                   "| tv a | yes | yes (1.0e-07; 2.0e-07) | 3.1 |\n| tv b | yes | yes (1) | 2.0 |\n"
                   "| tv c | not run: 9 M parameters | | |\n| tv d | no: x | | 1.5 |\n"
                   "| tv e | yes | yes (3) | 81.0 |\n")
    new.write_text("| tv b | yes | yes (2) | yes (1.0e-07; composed: HSwish) | 4.0 |\n  (tv b: peak resident memory)\n"
                   "| tv e | not run: 645 M parameters need about 14 GiB, this run has 12 GiB |  |  |  |\n"
                   "| tv f | not run: 9 M parameters need about 2 GiB, this run has 1 GiB |  |  |  |\n")
    rows = port_zoo.earlier_rows([old, new])
    assert sorted(rows) == ["tv a", "tv b", "tv d", "tv e"]
    assert rows["tv e"].row() == ("| tv e | yes | yes (3) | not run: 645 M parameters need about 14 GiB, this run has "
                                  "12 GiB | 81.0 |")
    assert rows["tv a"].row() == f"| tv a | yes | yes (1.0e-07; 2.0e-07) | {port_zoo.NO_ONNX_YET} | 3.1 |"
    assert rows["tv b"].row() == "| tv b | yes | yes (2) | yes (1.0e-07; composed: HSwish) | 4.0 |"
    assert rows["tv d"].row() == "| tv d | no: x |  |  | 1.5 |"


def test_a_model_needing_more_memory_than_the_run_has_is_listed_with_the_reason():
    rows = port_zoo.run(["torchvision squeezenet1_1"], 1e9, 60, {}, memory=2 ** 20)
    assert [row.row() for row in rows] == [
        "| torchvision squeezenet1_1 | not run: 1 M parameters need about 1 GiB, this run has 0 GiB |  |  |  |"]


# -- a worker's port writes what the earlier flow wrote ------------------------------------------------------------
def _files(folder: Path):
    return {str(path.relative_to(folder)): path.read_bytes().replace(str(folder).encode(), b"DIR")
            for path in sorted(folder.rglob("*")) if path.is_file()}


def test_a_worker_s_port_writes_the_bytes_the_earlier_flow_wrote(tmp_path, monkeypatch):
    """The earlier flow, here in this process: the model's weights saved by weights_without_zeros, port building
    the model again and loading them (MindSpore's asynchronous operators); a worker's (python -m bench.port_zoo
    --keep, a process of its own: a process forked after MindSpore ran an operator can hang): the model built once
    and handed to port, synchronous operators. Both on torch's default threads: torch's results move in the last
    bits with its thread count, which the comparison's differences show (--threads 1 is the zoo's default)."""
    import torch

    from trainkit.bridge.port import port

    torchvision, _ = port_zoo.import_zoo()
    label = "torchvision squeezenet1_1"
    index, (_, target, arguments, shape, factory) = next(
        (index, case) for index, case in enumerate(port_zoo.cases(torchvision)) if case[0] == label)
    done = subprocess.run([sys.executable, "-m", "bench.port_zoo", "--only", label, "--keep", str(tmp_path / "worker"),
                           "--threads", "0"], capture_output=True, text=True, check=False, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"| {label} | yes | yes (" in done.stdout
    monkeypatch.syspath_prepend(str(tmp_path / "earlier"))
    earlier, worker = tmp_path / "earlier" / f"zoo{index}", tmp_path / "worker" / f"zoo{index}"
    torch.manual_seed(0)
    weights = port_zoo.weights_without_zeros(factory, arguments, tmp_path / "weights.pth")
    assert port(target, arguments, earlier, list(shape), weights=weights) == 0
    monkeypatch.delitem(sys.modules, f"zoo{index}.model")
    made = _files(worker)
    assert "weights.ckpt" in made and "compare.csv" in made and "model.py" in made
    assert made == _files(earlier)


def test_the_transformers_section_is_written_between_its_own_markers_and_leaves_the_vision_table(tmp_path):
    """--transformers rewrites its section only; its rows carry the export back to PyTorch where the vision rows
    carry ONNX. Mutation caught: the section written between the vision table's markers."""
    page = tmp_path / "page.md"
    page.write_text(f"a\n{port_zoo.BEGIN}\n| vision row |\n{port_zoo.END}\nb\n{port_zoo.HF_BEGIN}\nold\n"
                    f"{port_zoo.HF_END}\nc\n")
    row = port_zoo.Result("transformers Bert", "yes", "yes (1.0e-07; 2.0e-07)", 3.14, torch="yes (5 tensors; 0.0e+00)")
    port_zoo.write_table(row.torch_row(), page, port_zoo.HF_BEGIN, port_zoo.HF_END)
    written = "| transformers Bert | yes | yes (1.0e-07; 2.0e-07) | yes (5 tensors; 0.0e+00) | 3.1 |"
    assert page.read_text() == (f"a\n{port_zoo.BEGIN}\n| vision row |\n{port_zoo.END}\nb\n{port_zoo.HF_BEGIN}\n"
                                f"{written}\n{port_zoo.HF_END}\nc\n")
