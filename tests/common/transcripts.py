"""Console transcripts in the docs: ```console blocks of `$ command` lines, each followed by what it prints.

The blocks of one page are one session, run top to bottom in one directory, as a reader following the page
would (a later block may use a run directory an earlier one made). A shown line matches a printed line when
it is equal, `...` standing for any text within the line; a line that is only `...` stands for lines left
out. `$ echo $?` shows the previous command's exit status; `$ cd DIR` moves the session into DIR.
"""
from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import runpy
import shlex
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Optional

from markdown_it import MarkdownIt

REPO = Path(__file__).resolve().parents[2]
USER_PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md")), *sorted((REPO / "examples").rglob("*.md"))]
ELIDED = "..."
ECHO_STATUS = ["echo", "$?"]


@dataclass
class Command:
    argv: List[str]
    shown: List[str] = field(default_factory=list)  # the lines the docs show it printing
    status: Optional[int] = None  # shown by a following `$ echo $?`

    def expected_status(self) -> int:
        if self.status is not None:
            return self.status
        return 2 if any(line.startswith("trainkit: error:") for line in self.shown) else 0


@dataclass
class Transcript:
    """The console blocks of one page, their commands in order."""

    page: Path
    commands: List[Command]

    @property
    def name(self) -> str:
        return str(self.page.relative_to(REPO))


def transcripts(pages=USER_PAGES) -> Iterator[Transcript]:
    parser = MarkdownIt("commonmark")
    for page in pages:
        commands = [command for token in parser.parse(page.read_text(encoding="utf-8"))
                    if token.type == "fence" and token.info.strip() == "console" for command in parse(token.content)]
        if commands:
            yield Transcript(page, commands)


def page_files(page: Path) -> Dict[str, str]:
    """The files a page asks the reader to save: code blocks titled with a file name (```python title="x.py"```)."""
    files = {}
    for token in MarkdownIt("commonmark").parse(page.read_text(encoding="utf-8")):
        title = re.search(r'title="([^"/]+)"', token.info) if token.type == "fence" else None
        if title:
            files[title.group(1)] = token.content
    return files


def parse(content: str) -> List[Command]:
    commands: List[Command] = []
    for line in content.splitlines():
        if line.startswith("$ "):
            commands.append(Command(shlex.split(line[2:])))
        elif commands and commands[-1].argv == ECHO_STATUS:
            commands[-2].status = int(line)  # what `echo $?` printed: the status of the command before it
        elif commands:
            commands[-1].shown.append(line.rstrip())
    return [command for command in commands if command.argv != ECHO_STATUS]


def line_pattern(shown: str) -> re.Pattern:
    return re.compile(".*".join(re.escape(part) for part in shown.split(ELIDED)))


def unmatched(shown: List[str], printed: List[str]) -> List[str]:
    """The shown lines not found, in order, among the printed ones."""
    missing, position = [], 0
    for line in shown:
        if line.strip() == ELIDED:
            continue
        pattern = line_pattern(line)
        found = next((i for i in range(position, len(printed)) if pattern.fullmatch(printed[i])), None)
        if found is None:
            missing.append(line)
        else:
            position = found + 1
    return missing


@dataclass
class Printed:
    status: int
    stdout: str
    stderr: str

    @property
    def lines(self) -> List[str]:
        return [line.rstrip() for line in (self.stdout + self.stderr).splitlines()]


def run_in_process(argv: List[str]) -> Printed:
    """`python -m MODULE ARGS` run in this process by runpy, the current directory first on the import path as
    `python -m` puts it: trainkit's bad input fails before anything compiles, so a command costs a config
    composition rather than a MindSpore start-up."""
    if argv[:2] != ["python", "-m"] or len(argv) < 3:
        raise ValueError(f"a transcript command must be `python -m MODULE ...`; got {shlex.join(argv)}")
    from hydra.core.global_hydra import GlobalHydra

    stdout, stderr = io.StringIO(), io.StringIO()
    root, trainkit_log = logging.getLogger(), logging.getLogger("trainkit")
    saved = (root.handlers[:], root.level, trainkit_log.handlers[:], trainkit_log.level, trainkit_log.propagate)
    saved_argv, saved_path, saved_modules, status = sys.argv, sys.path[:], set(sys.modules), 0
    sys.argv = [argv[2], *argv[3:]]
    sys.path.insert(0, os.getcwd())
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr), warnings.catch_warnings():
            # a module the tests imported already runs again as __main__, as `python -m` would run it afresh
            warnings.filterwarnings("ignore", "'.*' found in sys.modules", RuntimeWarning)
            runpy.run_module(argv[2], run_name="__main__", alter_sys=True)
    except SystemExit as stop:
        status = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
        for name in set(sys.modules) - saved_modules:  # a project's own modules, imported from the current directory
            if str(getattr(sys.modules[name], "__file__", None) or "").startswith(os.getcwd()):
                del sys.modules[name]
        for logger, handlers in ((root, saved[0]), (trainkit_log, saved[2])):
            for handler in logger.handlers:
                if handler not in handlers:
                    handler.close()
            logger.handlers[:] = handlers
        root.setLevel(saved[1])
        trainkit_log.setLevel(saved[3])
        trainkit_log.propagate = saved[4]
        GlobalHydra.instance().clear()
    return Printed(status, stdout.getvalue(), stderr.getvalue())
