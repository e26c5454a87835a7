"""`python -m bench.signal_race [--runs 60] [--max-delay 7 | --whole] [--stop] [overrides]`: the issue-30 reproduction.

Starts ``python -m trainkit recipe=digits_quickstart`` again and again and sends it SIGTERM or SIGINT (alternately)
after a random delay, most of them during start-up (``import hydra``, ``import mindspore``, composing, building),
and tallies how each run ended. Right: exit 128 + the signal's number and one line on stderr saying
``trainkit: stopped by NAME ...`` (or, in the training loop, the stop after a step logged on stdout; or, in the
last step, "came after the last step" and exit 0, as documented). Wrong: anything else -- exit 0 (a lost signal),
a traceback, a "Fatal Python error", more lines. ``--stop`` also stops the process (SIGSTOP) for 0.2 s and
continues it (SIGCONT) just before the signal, as Ctrl-Z then ``fg`` would: that interrupts the forwarding thread's
wait, which is what lost signals before the fix (DEVELOPERS.md, "Signals").
``--whole`` first times one unsignalled run (when the signals are routed, when the "finished" line comes, when the
process ends) and then spreads the delays over that whole run, its teardown after "finished" included;
``--after-finished`` counts the delays from the run's "finished" line instead (the teardown alone). A run that had
ended before its signal is tallied apart ("none").
Not a speed benchmark: it measures whether a signal can be lost.
"""
from __future__ import annotations

import argparse
import collections
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

REPO = Path(__file__).resolve().parents[1]
SENT = (signal.SIGTERM, signal.SIGINT)


def _start(run_dir: Path, overrides: List[str], **pipes) -> subprocess.Popen:
    env = {**os.environ, "GLOG_v": "3", "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen([sys.executable, "-m", "trainkit", "recipe=digits_quickstart", f"hydra.run.dir={run_dir}",
                             *overrides], cwd=run_dir.parent, env=env, text=True, **pipes)


def _routed(pid: int) -> bool:
    """Whether SIGTERM and SIGINT are blocked in the process's main thread (trainkit.process.signals routes them)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    mask = int(next(line for line in status.splitlines() if line.startswith("SigBlk:")).split()[1], 16)
    return all(mask & (1 << (signum - 1)) for signum in SENT)


def _exiting(pid: int) -> bool:
    """Whether the process is in its exit already (PF_EXITING in /proc/PID/stat's flags): the kernel no longer
    delivers a signal to it, and it is not a zombie yet, so ``poll()`` still says it runs (a large process's exit
    takes tens of milliseconds to unmap its memory)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return True
    return bool(int(fields[6]) & 0x4)


def timeline(run_dir: Path, overrides: List[str]) -> Dict[str, float]:
    """Seconds from the start of an unsignalled run to: its signals routed, its "finished" line, its end."""
    started = time.monotonic()
    process = _start(run_dir, overrides, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    moments: Dict[str, float] = {}
    while process.poll() is None and not _routed(process.pid):
        time.sleep(0.001)  # a measurement: polls /proc as fast as it usefully can
    moments["routed"] = time.monotonic() - started
    for line in process.stdout:
        if "] - finished: " in line:
            moments["finished"] = time.monotonic() - started
    process.wait()
    moments["ended"] = time.monotonic() - started
    return moments


def one_run(run_dir: Path, signum: int, delay: float, stop: bool, overrides: List[str],
            after_finished: bool = False) -> Tuple[Optional[int], str, str]:
    """The exit status, stdout and stderr of one run signalled ``delay`` seconds after its start (or after its
    "finished" line)."""
    process = _start(run_dir, overrides, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    before = []
    if after_finished:  # the delay counts from the "finished" line: the teardown, window (2) of DEVELOPERS.md
        for line in process.stdout:
            before.append(line)
            if "] - finished: " in line:
                break
    time.sleep(delay)  # a random moment is the point here (a reproduction, not a test)
    if stop and process.poll() is None:
        process.send_signal(signal.SIGSTOP)
        time.sleep(0.2)
        process.send_signal(signal.SIGCONT)
    if process.poll() is not None or _exiting(process.pid):  # ended (or ending) before the signal: nothing to tally
        stdout, stderr = process.communicate()
        return process.returncode, "".join(before) + stdout, stderr + "\n(ended before the signal)"
    process.send_signal(signum)
    try:
        stdout, stderr = process.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        process.kill()
        stdout, stderr = process.communicate()
        return None, "".join(before) + stdout, stderr
    return process.returncode, "".join(before) + stdout, stderr


def verdict(signum: int, status: int, stdout: str, stderr: str) -> str:
    """``right: ...`` (how it ended) or ``wrong: ...`` (what was wrong), in a few words."""
    name = signal.Signals(signum).name
    if status is None:
        return "wrong: hung (killed after 300 s)"
    if stderr.endswith("(ended before the signal)"):
        return "none: the run had ended before the signal"
    if "Traceback" in stderr or "Fatal Python error" in stderr:
        return f"wrong: exit {status} with a traceback"
    if status == 0 and f"{name} came after the last step" in stdout and not stderr:
        return "right: after the last step, finished (documented), exit 0"
    if status == 0:
        return "wrong: exit 0 (signal lost)"
    if status != 128 + signum:
        return f"wrong: exit {status}"
    if f"stopped by {name} after step" in stdout and not stderr:
        return "right: stopped after a step with a checkpoint"
    if stderr.count("\n") == 1 and stderr.startswith(f"trainkit: stopped by {name} outside the training loop"):
        return ("right: one line, after the work was done" if "after the command had done its work" in stderr
                else "right: one line, outside the training loop")
    return f"wrong: exit {status}, not the one line"


def main(argv: List[str] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.signal_race", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=60)
    parser.add_argument("--min-delay", type=float, default=0.0, help="seconds")
    parser.add_argument("--max-delay", type=float, default=7.0, help="seconds; delays are uniform in between")
    parser.add_argument("--after-finished", action="store_true",
                        help="count the delays from the run's \"finished\" line (the teardown)")
    parser.add_argument("--whole", action="store_true",
                        help="time one unsignalled run first; delays then span all of it, teardown included")
    parser.add_argument("--signal", choices=["both", "SIGTERM", "SIGINT"], default="both",
                        help="which to send (both: alternately)")
    parser.add_argument("--stop", action="store_true", help="SIGSTOP for 0.2 s, then SIGCONT, before the signal")
    parser.add_argument("--seed", type=int, default=30)
    parser.add_argument("--lines", type=int, default=30, help="how much of a wrong run's stderr (or stdout) to show")
    parser.add_argument("overrides", nargs="*", help="more overrides for every run")
    args = parser.parse_args(argv)
    chosen = random.Random(args.seed)
    tally: Dict[str, int] = collections.Counter()
    with tempfile.TemporaryDirectory(prefix="signal_race-") as scratch:
        if args.whole:
            moments = timeline(Path(scratch) / "timeline", args.overrides)
            print("unsignalled run: " + ", ".join(f"{name} at {at:.3f}s" for name, at in moments.items()), flush=True)
            args.max_delay = moments["ended"] * 1.02
        for index in range(args.runs):
            sent = SENT if args.signal == "both" else (signal.Signals[args.signal],)
            signum, delay = sent[index % len(sent)], chosen.uniform(args.min_delay, args.max_delay)
            status, stdout, stderr = one_run(Path(scratch) / f"run{index}", signum, delay, args.stop,
                                             args.overrides, args.after_finished)
            outcome = verdict(signum, status, stdout, stderr)
            tally[outcome] += 1
            print(f"{index:3d} {signal.Signals(signum).name:7s} at {delay:4.2f}s: exit {status} {outcome}"
                  + ("" if outcome.startswith("right") else
                     "".join(f"\n    {line}" for line in (stderr or stdout).strip().splitlines()[-args.lines:])),
                  flush=True)
    print("\n".join(f"{count}/{args.runs} {outcome}" for outcome, count in sorted(tally.items())))
    return 0 if all(outcome.startswith(("right", "none")) for outcome in tally) else 1


if __name__ == "__main__":
    sys.exit(main())
