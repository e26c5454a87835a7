"""Shared test settings: quiet MindSpore logs and run each mode-dependent test in graph and pynative mode."""
import os
import re
import signal
from pathlib import Path

os.environ.setdefault("GLOG_v", "3")
# Tests send SIGINT to the processes they start and expect the disposition a terminal gives them. A suite started as
# a shell script's background job (`bash .ci/run &`) has SIGINT ignored, and an ignored signal stays ignored in every
# child (trainkit keeps it so, on purpose: tests/process/test_signals.py): a handler here makes the children start at
# default.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
# python -m trainkit caches compiled graphs per config (trainkit/app/compile_cache.py): not into the user's cache
os.environ.setdefault("TRAINKIT_CACHE_DIR", __import__("tempfile").mkdtemp(prefix="trainkit-test-cache-"))

import mindspore as ms  # noqa: E402
import pytest  # noqa: E402

MODES = {"graph": ms.GRAPH_MODE, "pynative": ms.PYNATIVE_MODE}


@pytest.fixture(params=list(MODES))
def mode(request):
    """Run the test once in GRAPH_MODE and once in PYNATIVE_MODE (on CPU)."""
    ms.set_context(mode=MODES[request.param], device_target="CPU")
    yield request.param
    ms.set_context(mode=ms.GRAPH_MODE)


@pytest.fixture
def graph_mode():
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    yield "graph"


@pytest.fixture(autouse=True, scope="session")
def _work_outside_the_repo(tmp_path_factory):
    """MindSpore's O1 rewrite writes `rewritten_network/` into the current directory: keep it out of the repo."""
    previous = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("cwd"))
    yield
    os.chdir(previous)


@pytest.fixture(scope="session")
def tiny_cifar10(tmp_path_factory):
    """CIFAR-10's binary files with 5 x 8 training and 8 test images (seed 5): shared by every test that trains a
    few steps on them and does not write into the folder."""
    from tests.common.cifar10_files import write_cifar10

    root = tmp_path_factory.mktemp("tiny_cifar10")
    write_cifar10(str(root), train_per_file=10, test_records=8, seed=5)
    return root


@pytest.fixture
def own_cache(tmp_path, monkeypatch):
    """TRAINKIT_CACHE_DIR in the test's folder, the built library forgotten before and after: the cache folder. For
    tests of building, caching and loading the library (each builds it: about 3 s)."""
    from trainkit import kernels

    monkeypatch.setenv("TRAINKIT_CACHE_DIR", str(tmp_path / "cache"))
    kernels.build._build.cache_clear()
    yield tmp_path / "cache"
    kernels.build._build.cache_clear()


@pytest.fixture
def shared_cache():
    """The process's TRAINKIT_CACHE_DIR (set above), where the library is built once per test process: for tests of
    what the kernels compute. The library an earlier test built in its own folder is forgotten before and after."""
    from trainkit import kernels

    kernels.build._build.cache_clear()
    yield Path(os.environ["TRAINKIT_CACHE_DIR"])
    kernels.build._build.cache_clear()


#: The suite's longest files (each about a minute of one worker's time or more), handed out first. `make test`'s
#: `--dist loadfile` hands whole files to its two workers, most tests first (pytest-xdist 3.6 sorts the files by
#: their number of tests), so these files of one or two long tests came last and kept one worker busy alone at the
#: end: a measured run took 1252 s of wall time for 1178 s of each worker's.
LONGEST_FIRST = ("tests/test_bench_models.py", "tests/distributed/test_launch.py", "tests/test_bench.py",
                 "tests/test_docs_transcripts.py", "tests/distributed/test_agreement.py",
                 "tests/app/test_documented_behaviours.py")


def pytest_xdist_make_scheduler(config, log):
    """`--dist loadfile` with LONGEST_FIRST's files at the head of its queue; any other mode as pytest-xdist has it."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class LongestFilesFirst(LoadFileScheduling):
        def _assign_work_unit(self, node):
            if not getattr(self, "_longest_first", False):  # the queue is complete by the first assignment
                self._longest_first = True
                for scope in reversed(LONGEST_FIRST):
                    if scope in self.workqueue:
                        self.workqueue.move_to_end(scope, last=False)
            super()._assign_work_unit(node)

    return LongestFilesFirst(config, log)


# ---------------------------------------------------------------------------------------------- test tiers
# Every test gets one tier, from what its file does (a file may say `pytestmark = pytest.mark.<tier>` instead):
#   system: starts processes (subprocess, msrun, python -m trainkit);
#   integration: trains or builds a run (train(), a tool's main, a MindSpore Model) or runs a docs example;
#   unit: everything else -- pure logic, no process, no training and no graph compiled (a test using the `mode` or
#   `graph_mode` fixture is integration). `make test-fast` runs these.
TIERS = ("unit", "integration", "system")
_SYSTEM = ("subprocess", "sys.executable", "msrun", "multiprocessing", "run_in_process", "os.fork")
_INTEGRATION = ("train(", "compose_config(", ".main(", "main([", "Model(", "train_digits_run", "tiny_cifar10",
                "TrainingWrapper(", "load_trained(", "export_model(", "port_model(")
_tier_of_file: dict = {}


def tier_of(path: Path) -> str:
    """The tier of a test file, from its source (cached per file)."""
    if path not in _tier_of_file:
        if path.suffix != ".py":
            _tier_of_file[path] = "integration"  # README.md and docs/: examples that may train
        else:
            source = path.read_text(encoding="utf-8")
            # what the file's shared helpers (tests/common/...) do counts as the file's own
            for module in re.findall(r"^from (tests\.[\w.]+) import|^import (tests\.[\w.]+)", source, re.M):
                helper = Path(__file__).resolve().parent.parent / (next(m for m in module if m).replace(".", "/")
                                                                   + ".py")
                if helper.is_file() and helper != path:
                    source += helper.read_text(encoding="utf-8")
            _tier_of_file[path] = ("system" if any(word in source for word in _SYSTEM) else
                                   "integration" if any(word in source for word in _INTEGRATION) else "unit")
    return _tier_of_file[path]


_COMPILES = ("mode", "graph_mode")  # fixtures that run the test under MindSpore's graph compiler


def pytest_collection_modifyitems(config, items):
    for item in items:
        if not any(item.get_closest_marker(tier) for tier in TIERS):
            tier = tier_of(Path(str(item.fspath)))
            if tier == "unit" and any(name in getattr(item, "fixturenames", ()) for name in _COMPILES):
                tier = "integration"  # compiles graphs: seconds each, not pure logic
            item.add_marker(getattr(pytest.mark, tier))
