"""trainkit.process.startup_gc: a command's start-up runs no full garbage collection, and the collector is back on, with
the start-up's objects frozen, before anything is built (docs/performance.md)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _python(code: str) -> str:
    """Run `code` in a fresh interpreter (the collector's state is the process's) and return what it printed."""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_pause_stops_collections_and_resume_freezes_what_exists_then_collects_again():
    printed = _python(
        "import gc\n"
        "from trainkit.process import startup_gc\n"
        "startup_gc.pause()\n"
        "print(gc.isenabled(), startup_gc.paused())\n"
        "before = gc.get_stats()[0]['collections']\n"
        "garbage = [[object()] for _ in range(20000)]\n"  # past the young generation's threshold of 700 many times
        "print(gc.get_stats()[0]['collections'] == before)\n"
        "startup_gc.resume()\n"
        "print(gc.isenabled(), startup_gc.paused(), gc.get_freeze_count() >= 20000)\n"
        "startup_gc.resume()\n"  # idempotent: nothing frozen twice, nothing turned on twice
        "print(gc.isenabled())\n")
    assert printed.split() == ["False", "True", "True", "True", "False", "True", "True"]


def test_a_collector_that_was_off_stays_off_and_nothing_is_frozen():
    """An embedding program that turned the collector off keeps it off: pause/resume only undo what pause did."""
    printed = _python(
        "import gc\n"
        "from trainkit.process import startup_gc\n"
        "gc.disable()\n"
        "startup_gc.pause()\n"
        "startup_gc.resume()\n"
        "print(gc.isenabled(), gc.get_freeze_count())\n")
    assert printed.split() == ["False", "0"]


def test_python_m_trainkit_runs_no_full_collection_before_it_builds_and_collects_again(tmp_path):
    """The quick start's command, one epoch: when the network is built (after the imports, Hydra's composition and
    the run directory), no full collection has run, the start-up's objects are frozen and the collector is on.
    Mutation caught: without ``startup_gc.pause()`` in ``trainkit/__main__.py`` the imports ran 3 full collections;
    without ``resume()`` the collector stayed off for the whole run."""
    record = tmp_path / "collector.json"
    result = subprocess.run(
        [sys.executable, "-m", "trainkit", "recipe=digits_quickstart", "trainer.epochs=1",
         "model._target_=tests.common.collector.RecordsTheCollector", f"+model.record={record}",
         f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={**os.environ, "GLOG_v": "3", "PYTHONPATH": str(REPO), "TRAINKIT_COMPILE_CACHE": "0"})
    assert result.returncode == 0, result.stderr[-3000:]
    state = json.loads(record.read_text())
    assert state["full_collections"] == 0
    assert state["enabled"] is True
    assert state["frozen"] > 100_000  # MindSpore, Hydra and trainkit's modules


def _project(tmp_path: Path) -> Path:
    """A project package whose __main__ is trainkit's command (``trainkit.project.main``), and a script calling it."""
    (tmp_path / "conf").mkdir()
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "__init__.py").write_text("")
    (tmp_path / "proj" / "__main__.py").write_text("import trainkit.project\n\n"
                                                "trainkit.project.main(config_path='../conf')\n")
    (tmp_path / "script.py").write_text("import trainkit.project\n\ntrainkit.project.main(config_path='conf')\n")
    return tmp_path


# Reports, as the process ends, whether the collector is on and how much start-up froze: frozen objects mean it paused.
_REPORT = ("import atexit, gc, os, runpy, sys\n"
           "atexit.register(lambda: os.write(1, f'FROZEN {gc.get_freeze_count()} ON {gc.isenabled()}\\n'.encode()))\n")


def _report(folder: Path, code: str) -> str:
    result = subprocess.run([sys.executable, "-c", _REPORT + code], cwd=folder, capture_output=True, text=True,
                            timeout=120, env={**os.environ, "GLOG_v": "3", "PYTHONPATH": f"{REPO}{os.pathsep}{folder}"})
    return next(line for line in result.stdout.splitlines() if line.startswith("FROZEN"))


def test_a_projects_python_m_pauses_and_resumes_but_a_script_calling_main_leaves_the_collector_alone(tmp_path):
    """``python -m proj`` (runpy, as python -m runs it) through ``trainkit.project.main`` pauses the collector for its
    start-up and resumes it (so its start-up's objects are frozen); a script, a notebook cell or a test calling
    ``cli.main`` is not its command process and keeps its heap as it was. Mutation caught: the old test of the caller
    (module-level code named ``__main__``, which a script and a notebook cell are too) froze the script's heap."""
    folder = _project(tmp_path)
    frozen, _, on = _report(folder, "sys.argv = ['proj', '--cfg', 'job']\n"
                                    "runpy.run_module('proj', run_name='__main__', alter_sys=True)\n").split()[1:]
    assert int(frozen) > 10_000 and on == "True"
    assert _report(folder, "sys.argv = ['script.py', '--cfg', 'job']\n"
                           "runpy.run_path('script.py', run_name='__main__')\n") == "FROZEN 0 ON True"



TOOLS = ("predict", "evaluate", "export", "compare", "convert", "port")


@pytest.mark.parametrize("tool", TOOLS)
def test_a_tools_command_runs_no_full_collection_in_its_imports_and_collects_again(tool):
    """``python -m trainkit.<tool> --help``, run as ``python -m`` runs it (runpy, the module named ``__main__``):
    its imports (MindSpore's among them) ran 3 full collections before; now none, what they made is frozen and the
    collector is on when the tool's work starts."""
    printed = _python(
        "import contextlib, gc, io, json, runpy, sys\n"
        "full = []\n"
        "gc.callbacks.append(lambda phase, info: full.append(1) if phase == 'stop' and info['generation'] == 2 "
        "else None)\n"
        f"sys.argv = ['trainkit.{tool}', '--help']\n"
        "with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):\n"
        f"    runpy.run_module('trainkit.{tool}', run_name='__main__', alter_sys=True)\n"
        "print(json.dumps([len(full), gc.isenabled(), gc.get_freeze_count() > 10000]))\n")
    assert json.loads(printed.splitlines()[-1]) == [0, True, True]


def test_a_tools_module_imported_as_a_library_leaves_the_collector_alone():
    printed = _python(
        "import gc, json\n"
        "import trainkit.export\n"  # trainkit.export.export_checkpoint is documented for library use
        "print(json.dumps([gc.isenabled(), gc.get_freeze_count()]))\n")
    assert json.loads(printed.splitlines()[-1]) == [True, 0]
