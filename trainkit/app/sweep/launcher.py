"""trainkit's Hydra launcher (``hydra/launcher=trainkit``, the default): Hydra's basic launcher, plus repeats, and a
sweep that a signal stops keeps its summary and says how to continue all of it.

* ``sweep.repeats=N`` runs every job a sweeper asks for N times, with ``trainer.seed`` = the configured seed + 0 ..
  N - 1 (the data order follows it; the data split has its own seed). N is at most 1,000 and N x the configurations
  the sweeper will ask for at most 10,000 jobs, refused in :meth:`RepeatingLauncher.setup`, before the sweeper
  makes its folder or lists its jobs (:func:`size_problem`). The sweeper gets one result per job it asked
  for: the mean of its repeats' best values, so Optuna's objective for a trial is that mean. The repeat of job j
  (as the sweeper numbers them) r is job ``j * N + r``, in the folder of that number.
* ``trainer.resume=auto`` on a ``-m`` command continues the sweep in ``hydra.sweep.dir``: a job whose record says it
  completed is not run again (its result is read back), an interrupted one resumes from its checkpoint, the others
  run. A job stopped by SIGTERM or SIGINT ends the sweep with the summary of the jobs so far and that command.
"""
from __future__ import annotations

import contextlib
import itertools
import math
import sys
from pathlib import Path
from typing import Any, List, Optional, Sequence

from hydra._internal.core_plugins.basic_launcher import BasicLauncher
from hydra.core.utils import JobReturn, JobStatus
from omegaconf import DictConfig, OmegaConf

from trainkit.app.config import MAX_REPEATS, MAX_SWEEP_JOBS
from trainkit.app.sweep.records import JOB_RECORD, objective, read_record
from trainkit.process import signals
from trainkit.rundir.command import sweep_continue_command

SEED = "trainer.seed"
RESUME = "trainer.resume"


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


class RepeatingLauncher(BasicLauncher):
    """Hydra's basic launcher (jobs one after another in this process) with ``sweep.repeats`` and a sweep that can
    be stopped and continued."""

    def setup(self, *, config: DictConfig, **kwargs: Any) -> None:
        super().setup(config=config, **kwargs)
        signals.stop_by_exception()  # a signal between or inside jobs reaches launch(), which writes the summary
        self.sweep_dir = Path(str(config.hydra.sweep.dir))
        self.new_sweep_dir = not self.sweep_dir.exists()  # the sweeper creates it before the first launch
        problem = size_problem(config)  # before the sweeper makes its folder and lists its jobs
        if problem:
            self._refuse(problem)
        self.repeats = int(OmegaConf.select(config, "sweep.repeats", default=1))
        self.base_seed = int(OmegaConf.select(config, SEED, default=0) or 0)
        self.continuing = OmegaConf.select(config, RESUME, default=None) == "auto"

    def _expand(self, job_overrides: Sequence[Sequence[str]]) -> List[List[str]]:
        """Each job's overrides N times, each with its seed; a swept seed beside repeats is refused."""
        if self.repeats < 2:
            return [list(overrides) for overrides in job_overrides]
        expanded = []
        for overrides in job_overrides:
            given = [o for o in overrides if _key(o) == SEED]
            if any(o.split("=", 1)[1] != str(self.base_seed) for o in given):
                last = self.base_seed + self.repeats - 1
                self._refuse(f"sweep.repeats={self.repeats} gives every configuration the seeds trainer.seed="
                        f"{self.base_seed}..{last}, but the sweep sets trainer.seed per job too ({given[0]}): sweep "
                        "trainer.seed (its runs are grouped as repeats too) or set sweep.repeats, not both")
            rest = [o for o in overrides if _key(o) != SEED]
            expanded += [[*rest, f"{SEED}={self.base_seed + r}"] for r in range(self.repeats)]
        return expanded

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        expanded = self._expand(job_overrides)
        first = initial_job_idx * self.repeats
        returns: List[Optional[JobReturn]] = [None] * len(expanded)
        sweep_dir = self.sweep_dir
        to_run = []
        for index, overrides in enumerate(expanded):
            done = self._completed(sweep_dir, first + index, overrides) if self.continuing else None
            if done is not None:
                returns[index] = done
            else:
                to_run.append(index)
        try:
            for start, stop in _stretches(to_run):  # each job keeps its number, whatever is skipped before it
                returns[start:stop] = super().launch(expanded[start:stop], first + start)
        except BaseException as stop:
            signum = getattr(stop, "signum", None) or (stop.code - 128 if isinstance(stop, SystemExit) and
                                                       isinstance(stop.code, int) and stop.code > 128 else None)
            if signum is not None:
                self._stopped(sweep_dir, first + len(expanded))
            raise
        return [self._combined(returns[i * self.repeats:(i + 1) * self.repeats]) for i in range(len(job_overrides))]

    def _completed(self, sweep_dir: Path, job: int, overrides: List[str]) -> Optional[JobReturn]:
        """A continued sweep: job `job`'s result when its record says it completed, else None (it runs)."""
        record = read_record(sweep_dir, job)
        if record is None or record["status"] != "completed":
            return None
        same = [o for o in overrides if _key(o) != RESUME]
        if [o for o in record["overrides"] if _key(o) != RESUME] != same:
            self._refuse(f"trainer.resume=auto continues the sweep in {sweep_dir}, but its job {job} ran with other "
                    f"overrides ({' '.join(record['overrides'])}): give the command that started that sweep, with "
                    "trainer.resume=auto")
        print(f"[trainkit] job {job} completed before: not run again ({record['run_dir']})", file=sys.stderr)
        return _result(overrides, objective(Path(record["run_dir"])), record["run_dir"])

    def _refuse(self, message: str) -> None:
        """Bad input, found before any job ran: one line, exit status 2, no empty sweep folder left behind."""
        if self.new_sweep_dir:
            for leftover in (self.sweep_dir / "multirun.yaml", self.sweep_dir):
                with contextlib.suppress(OSError):
                    leftover.unlink() if leftover.is_file() else leftover.rmdir()
        print(f"trainkit: error: {message}", file=sys.stderr)
        sys.exit(2)

    def _combined(self, returns: Sequence[Optional[JobReturn]]) -> JobReturn:
        """One result for the sweeper: the mean of the repeats' objectives (NaN when one has none)."""
        if len(returns) == 1:
            return returns[0]
        for result in returns:
            if result.status != JobStatus.COMPLETED:
                return result
        values = [float(result.return_value) for result in returns]
        mean = math.nan if any(math.isnan(v) for v in values) else sum(values) / len(values)
        combined = _result([o for o in returns[0].overrides if _key(o) != SEED], mean, returns[0].working_dir)
        combined.cfg, combined.hydra_cfg = returns[0].cfg, returns[0].hydra_cfg
        return combined

    def _stopped(self, sweep_dir: Path, end: int) -> None:
        """A job was stopped by a signal: the summary of the jobs so far, and the command that continues them all."""
        from trainkit.app.sweep import markdown, write_summary

        if any(sweep_dir.glob(JOB_RECORD.format("*"))):
            print("\n" + markdown(write_summary(sweep_dir)), end="")
        task = list(self.config.hydra.overrides.task)
        hydra_overrides = list(self.config.hydra.overrides.hydra)
        print(f"trainkit: the sweep was stopped by a signal; the jobs so far are in {sweep_dir / 'summary.md'}. "
              f"Continue the sweep (the stopped job from its checkpoint, the jobs that did not run, none that "
              f"completed) with: {sweep_continue_command(sweep_dir.resolve(), task, hydra_overrides)}",
              file=sys.stderr)


def planned_configurations(config: DictConfig) -> Optional[int]:
    """How many jobs the sweeper will ask for, when it says so before it starts: its ``n_trials`` (Optuna's), or
    for Hydra's basic sweeper the product of the sizes of its swept values (command line and
    ``hydra.sweeper.params``), counted up to ``MAX_SWEEP_JOBS + 1``; None when neither is known."""
    sweeper = config.hydra.sweeper
    trials = OmegaConf.select(sweeper, "n_trials", default=None)
    if isinstance(trials, int) and not isinstance(trials, bool):
        return trials
    if not str(OmegaConf.select(sweeper, "_target_", default="")).endswith("BasicSweeper"):
        return None
    from hydra.core.override_parser.overrides_parser import OverridesParser

    params = OmegaConf.select(sweeper, "params", default=None) or {}
    arguments = [*(f"{key}={value}" for key, value in params.items()),
                 *OmegaConf.to_container(config.hydra.overrides.task, resolve=False)]
    total = 1
    try:
        for override in OverridesParser.create().parse_overrides(arguments):
            if override.is_sweep_override():
                total *= sum(1 for _ in itertools.islice(override.sweep_iterator(), MAX_SWEEP_JOBS + 1))
                total = min(total, MAX_SWEEP_JOBS + 1)
    except Exception:  # noqa: BLE001 -- a glob or an interval: the sweeper reports it as it always has
        return None
    return total


def size_problem(config: DictConfig) -> Optional[str]:
    """Why the sweep's size is refused, or None: ``sweep.repeats`` in [1, MAX_REPEATS], and repeats x the
    configurations the sweeper will ask for at most MAX_SWEEP_JOBS. Checked before the sweeper lists its jobs or
    makes its folder: ``sweep.repeats=1000000000`` (a typo for 10) grew the job list by 700 MB/s."""
    repeats = OmegaConf.select(config, "sweep.repeats", default=1)
    if isinstance(repeats, bool) or not isinstance(repeats, int) or not 1 <= repeats <= MAX_REPEATS:
        return (f"sweep.repeats={repeats} is not valid: it must be an integer in [1, {MAX_REPEATS:,}] (the seeds "
                "each configuration of a -m sweep runs with)")
    configurations = planned_configurations(config)
    if configurations is not None and repeats * configurations > MAX_SWEEP_JOBS:
        jobs = (f"{repeats:,} x {configurations:,} configurations = {repeats * configurations:,} jobs"
                if configurations <= MAX_SWEEP_JOBS else f"{repeats:,} x more than {MAX_SWEEP_JOBS:,} configurations")
        return (f"sweep.repeats={repeats} gives {jobs}, and a -m sweep runs at most {MAX_SWEEP_JOBS:,}: sweep fewer "
                "values (or a smaller hydra.sweeper.n_trials) or lower sweep.repeats")
    return None


def _result(overrides: Sequence[str], value: float, working_dir: Optional[str]) -> JobReturn:
    result = JobReturn(overrides=list(overrides), working_dir=working_dir, status=JobStatus.COMPLETED)
    result.return_value = value
    return result


def _stretches(indices: List[int]) -> List[tuple]:
    """Sorted indices as [start, stop) stretches of consecutive numbers."""
    stretches: List[List[int]] = []
    for index in indices:
        if stretches and stretches[-1][1] == index:
            stretches[-1][1] = index + 1
        else:
            stretches.append([index, index + 1])
    return [tuple(s) for s in stretches]

