"""The port zoo table: every torchvision classification model and a list of timm models, ported by
``python -m trainkit.port``'s Python API from their own (random) weights, with whether each agrees with PyTorch
in eval mode and how long the port took. ``python -m bench.port_zoo`` writes the table into
docs/coming-from-pytorch.md between its marker comments (``--only NAME`` runs some models and prints their rows).

Small inputs keep it short (64x64 where a model takes it); a model above ``--max-parameters`` is not built and
its row says so, and one the time budget leaves unrun says that too: no model is left out silently.

``--transformers`` makes the table's section of Hugging Face ``transformers`` models instead (between its own
markers): each built from a small config (:mod:`bench.hf_models`), ported with token ids where it takes them, and
its ported weights exported back by ``export --to torch`` and loaded strictly into the model's own class.

Each model is ported in a process of its own, forked from this one once torch, torchvision, timm and MindSpore
are imported (no import per model, and a model's memory is given back when its process ends); ``--jobs N`` runs
N at a time, the largest first, and holds back a model while the ones running would leave it too little memory
(``--memory``). A worker runs torch on ``--threads`` threads (1) and MindSpore's operators synchronously
(``mindspore.runtime.launch_blocking``): on a small loaded machine both were 3-5x faster than their defaults
(DEVELOPERS.md, "port zoo speed"), and neither changes a byte port writes. Each row is what ``--only MODEL`` gives
alone: every worker seeds torch with 0.
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import functools
import io
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

DOC = Path(__file__).resolve().parent.parent / "docs" / "coming-from-pytorch.md"
BEGIN, END = "<!-- port-zoo table: begin -->", "<!-- port-zoo table: end -->"
HF_BEGIN, HF_END = "<!-- port-zoo transformers table: begin -->", "<!-- port-zoo transformers table: end -->"
TIMM_MODELS = ["resnet10t", "resnet18", "resnet50", "resnext26ts", "efficientnet_b0", "efficientnet_lite0",
               "mobilenetv3_small_050", "mobilenetv3_large_100", "mobilenetv4_conv_small", "convnext_atto",
               "regnetx_002", "regnety_002", "ghostnet_050", "lcnet_050", "mixnet_s", "densenet121", "dla34", "vgg11",
               "vit_tiny_patch16_224", "deit_tiny_patch16_224", "swin_tiny_patch4_window7_224"]
# sample shapes other than 3x64x64, and constructor arguments beyond num_classes=10
SHAPES = {"inception_v3": (3, 96, 96), "vit_h_14": (3, 70, 70), "maxvit_t": (3, 224, 224),
          "swin_tiny_patch4_window7_224": (3, 224, 224)}
ARGUMENTS: Dict[str, Dict[str, Any]] = {"vit_b_16": {"image_size": 64}, "vit_b_32": {"image_size": 64},
                                        "vit_l_16": {"image_size": 64}, "vit_l_32": {"image_size": 64},
                                        "vit_h_14": {"image_size": 70},
                                        "vit_tiny_patch16_224": {"img_size": 64},
                                        "deit_tiny_patch16_224": {"img_size": 64}}


# a worker's peak beyond its parent's (memory_estimate): vgg11 (133 M parameters) 3.4 GiB with 0.7 GiB of imports,
# vgg11_bn 3.2 GiB and vit_l_32 (305 M) 5.1 GiB as forked workers: at most 22 bytes a parameter and 1 GiB
MEMORY_BASE = 1.0 * 2 ** 30
MEMORY_PER_PARAMETER = 22.0


def import_zoo():
    """(torchvision, timm), imported as port imports them (:mod:`trainkit.bridge.torch_import`: torchvision beside
    a torch its C++ operators were not built for)."""
    from trainkit.bridge.torch_import import import_torch

    import_torch()
    import timm
    import torchvision

    return torchvision, timm


@dataclass
class Result:
    model: str
    ported: str
    agrees: str
    seconds: Optional[float]
    onnx: str = ""  # the ported network exported to ONNX (trainkit.tools.deploy.write_checked): kept, or why not
    torch: str = ""  # its weights exported by export --to torch and loaded strictly into the PyTorch class, or why not

    def row(self) -> str:
        seconds = "" if self.seconds is None else f"{self.seconds:.1f}"
        return f"| {self.model} | {self.ported} | {self.agrees} | {self.onnx} | {seconds} |"

    def torch_row(self) -> str:
        """The row of the transformers section: the export back to PyTorch where the vision table has ONNX."""
        seconds = "" if self.seconds is None else f"{self.seconds:.1f}"
        return f"| {self.model} | {self.ported} | {self.agrees} | {self.torch} | {seconds} |"


def parameter_count(factory, arguments: Dict[str, Any]) -> int:
    """The model's parameter count, built on the meta device (no memory, no time)."""
    import torch

    with torch.device("meta"):
        model = factory(**arguments)
    return sum(value.numel() for value in model.parameters())


def own_weights(factory, arguments: Dict[str, Any]):
    """The model built with its own random weights, where a tensor its initialisation leaves all zero (ViT's
    head, layer scales, biases) is drawn at random too: a zero head makes every output equal on both sides, and the
    comparison then proves nothing."""
    import torch

    model = factory(**arguments)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for value in model.state_dict().values():
            if value.is_floating_point() and value.numel() and not value.any():
                value.copy_(0.02 * torch.randn(value.shape, generator=generator))
    return model


def weights_without_zeros(factory, arguments: Dict[str, Any], path: Path) -> Path:
    """:func:`own_weights`' state_dict, saved to `path`."""
    import torch

    torch.save(own_weights(factory, arguments).state_dict(), path)
    return path


@contextlib.contextmanager
def built_once(target: str, arguments: Dict[str, Any], model):
    """While inside, ``MODULE:FACTORY`` called with `arguments` returns `model` (once): port builds the model the
    row's weights come from instead of building it again and loading them from a file (the same values; three
    copies of the weights and a second initialisation fewer). Any other call is the factory's own, and the
    factory keeps its signature (``inspect.signature`` follows ``__wrapped__``) for port's constructor arguments."""
    module_name, _, name = target.partition(":")
    module = sys.modules[module_name]
    factory = getattr(module, name)
    waiting = [model]

    @functools.wraps(factory)
    def build(*args, **kwargs):
        if waiting and not args and kwargs == arguments:
            return waiting.pop()
        return factory(*args, **kwargs)

    setattr(module, name, build)
    try:
        yield
    finally:
        setattr(module, name, factory)


def port_one(label: str, target: str, arguments: Dict[str, Any], shape, folder: Path, factory,
             input_ints: Optional[int] = None, to_torch: bool = False) -> Result:
    """Port one model into `folder` from its own weights (none of them all zero), token ids in [0, `input_ints`)
    where given; its row, with the ONNX export's cell, or with `to_torch` the export back to PyTorch's."""
    from trainkit.bridge.port import port
    from trainkit.errors import CheckpointError, ConfigError, DataError

    printed = io.StringIO()
    start = time.perf_counter()
    try:
        model = own_weights(factory, arguments)
        with contextlib.redirect_stdout(printed), built_once(target, arguments, model):
            status = port(target, arguments, folder, list(shape), input_ints=input_ints)
    except (ConfigError, DataError, CheckpointError) as error:
        problems = [line for line in printed.getvalue().splitlines() if line.startswith("unsupported:")]
        reason = problems[0] if problems else str(error).splitlines()[0]
        more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
        return Result(label, f"no: {_cell(reason, 110)}{more}", "", time.perf_counter() - start)
    except Exception as error:  # noqa: BLE001 - a port bug: the row says what it was
        first = str(error).splitlines()[0] if str(error) else ""
        return Result(label, f"no: {type(error).__name__}: {_cell(first, 90)}", "", time.perf_counter() - start)
    seconds = time.perf_counter() - start
    difference = _network_difference(folder / "compare.csv")
    if difference is None and status != 0:  # the ported network did not run on the batch: what it said
        lines = printed.getvalue().strip().splitlines()
        return Result(label, "yes", f"no: {_cell(lines[-1] if lines else 'no comparison', 110)}", seconds)
    agrees = ("yes" if status == 0 else "no") + (f" ({difference[0]:.1e}; {difference[1]:.1e})" if difference else "")
    if to_torch:
        return Result(label, "yes", agrees, seconds, torch=torch_cell(folder, factory, arguments, model))
    del model  # the torch model freed before the ONNX export: the largest rows' peak memory is the port's, not both
    return Result(label, "yes", agrees, seconds, onnx_cell(folder, shape))


def torch_cell(folder: Path, factory, arguments: Dict[str, Any], model) -> str:
    """Whether the ported weights (``weights.ckpt``), written back by ``python -m trainkit.export CKPT OUT.pt --to
    torch``, load with ``load_state_dict(strict=True)`` into the model's class built again, and how far they are
    from `model`'s own (the ported ones: none, where the round trip is exact); the row's cell."""
    import torch

    from trainkit.bridge.export_torch import export_torch, tied_weights
    from trainkit.errors import CheckpointError, ConfigError, DataError

    output = folder.with_suffix(".pt")  # beside the port's folder, not in it
    try:
        export_torch(folder / "weights.ckpt", output, force=True)
        state = torch.load(output, weights_only=True)
        factory(**arguments).load_state_dict(state, strict=True)
    except (ConfigError, DataError, CheckpointError) as error:
        return f"no: {_cell(str(error), 110)}"
    except RuntimeError as error:  # load_state_dict's: the missing and unexpected names, one kind a line
        lines = [line.strip() for line in str(error).splitlines()[1:] if line.strip()]
        return f"no: {_cell(lines[0] if lines else str(error), 110)}"
    own = model.state_dict()
    difference = max((float((state[name].double() - value.double()).abs().max()) for name, value in own.items()
                      if value.numel()), default=0.0)
    tied = len(tied_weights(folder / "weights.ckpt")[0])
    return f"yes ({len(state)} tensors{f', {tied} tied' if tied else ''}; {difference:.1e})"


def onnx_cell(folder: Path, shape) -> str:
    """Whether the ported network (``model.py`` with ``weights.ckpt``, built for inference as ``export`` builds it)
    exports to ONNX and agrees with MindSpore's own outputs on port's batch (2 at `shape`, seed 0), as
    ``python -m trainkit.export RUN model.onnx`` checks a file before keeping it: the row's cell."""
    import hydra.utils
    import mindspore as ms
    from omegaconf import OmegaConf

    from trainkit.app.finetune import model_arguments
    from trainkit.bridge.compare import fixed_batch
    from trainkit.errors import ConfigError, DataError
    from trainkit.tools.deploy import ExportMismatch, write_checked
    from trainkit.tools.inference import InferenceCell, outputs

    try:
        node = OmegaConf.load(folder / "conf" / "model" / f"{folder.name}.yaml")
        network = hydra.utils.instantiate(model_arguments(node))  # without model.tied_weights, port's record
        ms.load_param_into_net(network, ms.load_checkpoint(str(folder / "weights.ckpt")), strict_load=True)
        network = InferenceCell(network)
        batch = fixed_batch([2, *shape], 0)
        # beside the port's folder, not in it (its files are the port's own): zoo<N>_onnx/model.onnx, with the
        # external data files MindSpore writes beside it for a network above 2 GB (protobuf's limit)
        checked = write_checked(network, batch, outputs(network, batch), onnx_path(folder), "ONNX", 2)
    except (ConfigError, DataError, ExportMismatch) as error:
        reason = str(error).split(": ", 1)[-1]
        return f"no: {_cell(reason.replace('MindSpore cannot export this network as ONNX ', ''), 110)}"
    except Exception as error:  # noqa: BLE001 - the row says what it was
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        return f"no: {type(error).__name__}: {_cell(first, 90)}"
    composed = f"; composed: {', '.join(checked.composed)}" if checked.composed else ""
    return f"yes ({checked.max_difference:.1e}{composed})"


def onnx_path(folder: Path) -> Path:
    """Where a row's ONNX file is written: a folder of its own beside the port's (removed with it)."""
    return folder.with_name(f"{folder.name}_onnx") / "model.onnx"


def _network_difference(table: Path) -> Optional[Tuple[float, float]]:
    """The network output's largest absolute difference and the relative one the tolerance judges (the absolute
    one over PyTorch's largest value: a deep net with random weights can put out 1e10, where 1e3 agrees)."""
    if not table.is_file():
        return None
    with table.open(encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            if row["name"] == "(network)" and row["max_abs_diff"]:
                return float(row["max_abs_diff"]), float(row["max_rel_diff"] or "nan")
    return None


def _cell(text: str, width: int) -> str:
    text = " ".join(text.replace("|", "/").split())
    return text if len(text) <= width else text[:width - 1] + "…"


def cases(torchvision) -> List[tuple]:
    """(label, MODULE:FACTORY, arguments, sample shape, factory) of every model of the table."""
    found = []
    for name in torchvision.models.list_models(module=torchvision.models):
        arguments = {"num_classes": 10, **ARGUMENTS.get(name, {})}
        if name in ("googlenet", "inception_v3"):
            arguments["init_weights"] = True  # else torchvision warns that it will
        found.append((f"torchvision {name}", f"torchvision.models:{name}", arguments,
                      SHAPES.get(name, (3, 64, 64)), torchvision.models.get_model_builder(name)))
    for name in TIMM_MODELS:
        import timm

        arguments = {"model_name": name, "num_classes": 10, **ARGUMENTS.get(name, {})}
        found.append((f"timm {name}", "timm:create_model", arguments, SHAPES.get(name, (3, 64, 64)),
                      timm.create_model))
    return found


NO_ONNX_YET = "not run (a row from before this column)"


def earlier_rows(paths: Sequence[Path]) -> Dict[str, Result]:
    """label -> row of the models an earlier run (its printed rows, in `paths`) ported: not run again. A row of
    the table before its ONNX column (four cells) is taken with an ONNX cell saying no export was tried; a later
    path's row of a model replaces an earlier path's. A later row saying the model was not run (too large for that
    run's memory) keeps the earlier port's row, and its reason becomes that row's ONNX cell where no export was
    tried before."""
    found: Dict[str, Result] = {}
    for path in paths:
        for line in path.read_text(encoding="utf-8").splitlines():
            cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
            if not line.startswith("| ") or len(cells) not in (4, 5) or cells[0] == "model":  # a table's header
                continue
            if cells[1].startswith("not run"):
                earlier = found.get(cells[0])
                if earlier is not None and earlier.ported == "yes" and earlier.onnx == NO_ONNX_YET:
                    earlier.onnx = cells[1]
                continue
            if len(cells) == 4:  # a row of a table from before the ONNX column: its port, no export tried
                cells.insert(3, NO_ONNX_YET if cells[1] == "yes" else "")
            found[cells[0]] = Result(cells[0], cells[1], cells[2], float(cells[4]) if cells[4] else None, cells[3])
    return found


def worker_setup(threads: int) -> None:
    """A worker's torch threads (0: torch's default) and MindSpore's synchronous operators (see the module), and
    torch's seed."""
    import mindspore as ms
    import torch

    if threads:
        torch.set_num_threads(threads)
    ms.runtime.launch_blocking()
    torch.manual_seed(0)


def memory_estimate(parameters: int) -> float:
    """Bytes a worker needs beyond the parent's: MEMORY_BASE, and MEMORY_PER_PARAMETER bytes a parameter (the
    torch model, the converted arrays, the MindSpore network and its checkpoint's copies)."""
    return MEMORY_BASE + MEMORY_PER_PARAMETER * parameters


def run(only: Sequence[str], max_parameters: float, budget: float, reuse: Dict[str, Result], jobs: int = 1,
        threads: int = 1, memory: Optional[float] = None, timeout: Optional[float] = None,
        keep: Optional[Path] = None) -> List[Result]:
    """The rows of the models `only` selects (all when empty), in the table's order; each model is ported in a
    forked worker, `jobs` at a time, largest first (:mod:`bench.fork_jobs`), within `memory` bytes (what the
    machine has available when None); into `keep`/zoo<N> (kept) when given, else a temporary folder."""
    from bench.fork_jobs import Job, available_memory, run_jobs

    torchvision, _ = import_zoo()
    import trainkit.bridge.port  # noqa: F401 - MindSpore imported once, before the workers are forked

    memory = available_memory() if memory is None else memory
    rows: Dict[str, Result] = {}
    order, waiting = [], []
    work = keep.resolve() if keep is not None else Path(tempfile.mkdtemp(prefix="port_zoo_"))
    work.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(work))
    try:
        for index, (label, target, arguments, shape, factory) in enumerate(cases(torchvision)):
            if only and not any(part in label for part in only):
                continue
            order.append(label)
            if label in reuse:
                rows[label] = reuse[label]
                continue
            try:
                count = parameter_count(factory, arguments)
            except NotImplementedError:  # an initialisation that reads values (RegNet's): torchvision's own count
                count = torchvision.models.get_model_weights(target.split(":")[1]).DEFAULT.meta["num_params"]
            needs = memory_estimate(count)
            if count > max_parameters:
                rows[label] = Result(label, f"not run: {count / 1e6:.0f} M parameters, above this run's "
                                            f"{max_parameters / 1e6:.0f} M", "", None)
            elif needs > memory:
                rows[label] = Result(label, f"not run: {count / 1e6:.0f} M parameters need about "
                                            f"{needs / 2 ** 30:.0f} GiB, this run has {memory / 2 ** 30:.0f} GiB",
                                     "", None)
            else:
                folder = work / f"zoo{index}"
                waiting.append((count, Job(label, needs, functools.partial(
                    _work, label, target, arguments, shape, folder, factory, threads, keep is None))))
        waiting.sort(key=lambda item: -item[0])

        def finished(outcome) -> None:
            rows[outcome.name] = _row(outcome, budget)
            print(rows[outcome.name].row(), flush=True)
            if outcome.peak is not None:
                print(f"  ({outcome.name}: peak resident memory {outcome.peak / 2 ** 30:.1f} GiB)", flush=True)

        run_jobs([job for _, job in waiting], jobs, memory, timeout, time.perf_counter() + budget, finished)
    finally:
        sys.path.remove(str(work))
        if keep is None:
            shutil.rmtree(work, ignore_errors=True)
    return [rows[label] for label in order]


def _work(label: str, target: str, arguments: Dict[str, Any], shape, folder: Path, factory, threads: int,
          remove: bool, input_ints: Optional[int] = None, to_torch: bool = False) -> Dict[str, Any]:
    """A worker's job: its row, as a dict."""
    worker_setup(threads)
    try:
        return asdict(port_one(label, target, arguments, shape, folder, factory, input_ints, to_torch))
    finally:
        if remove:
            shutil.rmtree(folder, ignore_errors=True)
            shutil.rmtree(onnx_path(folder).parent, ignore_errors=True)


def run_transformers(only: Sequence[str], jobs: int = 1, threads: int = 1, timeout: Optional[float] = None,
                     keep: Optional[Path] = None) -> List[Result]:
    """The rows of the transformers section's models that `only` selects (all when empty), in its order, each
    ported in a forked worker, `jobs` at a time (small configs: :data:`MEMORY_BASE` each)."""
    import trainkit.bridge.port  # noqa: F401 - MindSpore imported once, before the workers are forked
    from bench import hf_models
    from bench.fork_jobs import Job, available_memory, run_jobs

    rows: Dict[str, Result] = {}
    order, waiting = [], []
    work = keep.resolve() if keep is not None else Path(tempfile.mkdtemp(prefix="port_zoo_hf_"))
    work.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(work))
    try:
        for index, (label, target, arguments, shape, factory, ints) in enumerate(hf_models.cases()):
            if only and not any(part in label for part in only):
                continue
            order.append(label)
            waiting.append(Job(label, MEMORY_BASE, functools.partial(
                _work, label, target, arguments, shape, work / f"hf{index}", factory, threads, keep is None, ints,
                True)))

        def finished(outcome) -> None:
            rows[outcome.name] = _row(outcome, float("inf"))
            print(rows[outcome.name].torch_row(), flush=True)

        run_jobs(waiting, jobs, available_memory(), timeout, None, finished)
    finally:
        sys.path.remove(str(work))
        if keep is None:
            shutil.rmtree(work, ignore_errors=True)
    return [rows[label] for label in order]


def _row(outcome, budget: float) -> Result:
    """The row of a worker's outcome: its own, or why it has none."""
    if outcome.value is not None:
        return Result(**outcome.value)
    if outcome.seconds is None:
        return Result(outcome.name, f"not run: the table's time budget ({budget:.0f} s) was spent", "", None)
    return Result(outcome.name, f"no: the port's process {outcome.problem}", "", outcome.seconds)


def table(results: Sequence[Result], settings: str) -> str:
    lines = [f"Made by `python -m bench.port_zoo` ({settings}); random weights (a tensor the model "
             "initialises to zeros, such as ViT's head, drawn at random too), `num_classes=10`, a batch of 2 "
             "at 64x64 unless the model needs more. ONNX: the ported network (`model.py` and `weights.ckpt`) "
             "written as `python -m trainkit.export RUN model.onnx` writes it and kept only if onnxruntime's outputs "
             "are within 1e-4 x max(1, largest |output|) of MindSpore's on the same batch; \"composed\" names the "
             "layers written as compositions of operators the exporter has (docs/predict-deploy.md).", "",
             "| model | ported | agrees (max abs diff; relative) | ONNX exported and agrees (max abs diff) | seconds |",
             "|---|---|---|---|---|"]
    return "\n".join(lines + [result.row() for result in results])


def torch_table(results: Sequence[Result], settings: str) -> str:
    """The transformers section: its note and its rows."""
    import transformers

    version = transformers.__version__
    lines = [f"Made by `python -m bench.port_zoo --transformers` ({settings}; transformers {version}); each model "
             "built from a small config (`bench/hf_models.py`: 1-2 layers, hidden size 16, a vocabulary of 100) "
             "with random weights (a tensor the model initialises to zeros drawn at random too); text models "
             "take a batch of 2x16 token ids (with the attention mask of the pad id where the config names one), "
             "image models 2x3x16x16 (ViT) or 2x3x32x32. Exports: the ported `weights.ckpt` written back by "
             "`python -m trainkit.export CKPT OUT.pt --to torch` and loaded with `load_state_dict(strict=True)` into "
             "the model's own class built again: the tensors it holds (tied: names of a Parameter two modules "
             "share, written under each), and the largest difference from the model's own weights.", "",
             "| model | ported | agrees (max abs diff; relative) | exports --to torch, strict (max diff) | seconds |",
             "|---|---|---|---|---|"]
    return "\n".join(lines + [result.torch_row() for result in results])


def write_table(text: str, path: Path = DOC, begin: str = BEGIN, end: str = END) -> None:
    page = path.read_text(encoding="utf-8")
    if begin not in page or end not in page:
        raise SystemExit(f"{path} has no {begin} ... {end} markers to write the table between")
    head, rest = page.split(begin, 1)
    _, tail = rest.split(end, 1)
    path.write_text(f"{head}{begin}\n{text}\n{end}{tail}", encoding="utf-8")


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.port_zoo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", default=[], help="models whose label contains this (repeat); "
                        "prints the rows, writes nothing")
    parser.add_argument("--max-parameters", type=float, default=1e9, help="larger models are not built")
    parser.add_argument("--budget", type=float, default=3600, help="seconds; models not started by then are "
                        "listed as not run")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="models ported at once, each in a "
                        "process of its own (default: the CPU count)")
    parser.add_argument("--threads", type=int, default=1, help="torch's threads in each of them (default 1; 0: "
                        "torch's own default, the CPU count)")
    parser.add_argument("--memory", type=float, default=None, metavar="GIB", help="the memory the workers may "
                        "take together (default: what the machine has available at the start)")
    parser.add_argument("--keep", type=Path, default=None, metavar="DIR", help="port into DIR/zoo<N> and keep the "
                        "files (to read a row's model.py and compare.csv)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds one model may take; its row then says "
                        "it was stopped (0: no limit)")
    parser.add_argument("--rows-from", type=Path, action="append", default=[], metavar="LOG",
                        help="take the rows of the models an earlier run printed into LOG instead of porting them")
    parser.add_argument("--transformers", action="store_true", help="the section of Hugging Face transformers models "
                        "(bench/hf_models.py), each exported back to PyTorch and loaded strictly, instead")
    args = parser.parse_args(argv)
    for option, value, least in (("--jobs", args.jobs, 1), ("--threads", args.threads, 0)):
        if value < least:
            parser.error(f"{option} {value}: give {least} or more")
    if args.memory is not None and args.memory <= 0:
        parser.error(f"--memory {args.memory:g}: give the GiB the workers may take together, above 0")
    if args.transformers:
        results = run_transformers(args.only, args.jobs, args.threads, args.timeout or None, args.keep)
        if not args.only:
            write_table(torch_table(results, f"{args.jobs} at a time"), DOC, HF_BEGIN, HF_END)
            print(f"wrote {len(results)} rows into {DOC}")
        return 0
    results = run(args.only, args.max_parameters, args.budget, earlier_rows(args.rows_from), args.jobs,
                  args.threads, None if args.memory is None else args.memory * 2 ** 30, args.timeout or None, args.keep)
    if not args.only:
        write_table(table(results, f"at most {args.max_parameters / 1e6:.0f} M parameters, {args.jobs} at a time"))
        print(f"wrote {len(results)} rows into {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
