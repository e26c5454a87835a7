"""Every console transcript in README.md, docs/ and examples/ prints what it shows, with the exit status it implies.

Commands run in a temporary directory; those of an example project's README in a copy of the project.
"""
import json
import os
import shutil

import mindspore as ms
import numpy as np
import pytest
import yaml

from tests.common.transcripts import REPO, page_files, parse, run_in_process, transcripts, unmatched

TRANSCRIPTS = list(transcripts())
EXAMPLE_PROJECT = REPO / "examples" / "my_project"


def run_transcript(transcript):
    for command in transcript.commands:
        if command.argv[0] == "cd":  # the reader goes into a folder (a project trainkit.new made): the test's
            os.chdir(command.argv[1])  # own folder is restored by monkeypatch.chdir's undo
            continue
        printed = run_in_process(command.argv)
        where = f"{transcript.name}: $ {' '.join(command.argv)}"
        assert "Traceback" not in printed.stderr, f"{where}\n{printed.stderr}"
        assert printed.status == command.expected_status(), f"{where}\n{printed.stdout}\n{printed.stderr}"
        if any(line.startswith("trainkit: error:") for line in command.shown):  # the house rule: one line
            stderr = [line for line in printed.stderr.splitlines() if line.strip()]
            assert len(stderr) == 1, f"{where}\n{printed.stderr}"
        missing = unmatched(command.shown, printed.lines)
        assert not missing, f"{where}: not printed: {missing}\nprinted:\n" + "\n".join(printed.lines)


def test_the_docs_show_transcripts():
    assert len(TRANSCRIPTS) >= 6 and sum(len(t.commands) for t in TRANSCRIPTS) >= 25


@pytest.mark.parametrize("transcript", [t for t in TRANSCRIPTS if EXAMPLE_PROJECT not in t.page.parents],
                         ids=lambda t: t.name)
def test_transcript_prints_what_the_docs_show(transcript, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a page's commands share one folder: relative run directories, exports
    for name, content in page_files(transcript.page).items():  # the files the page has the reader save
        (tmp_path / name).write_text(content, encoding="utf-8")
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    run_transcript(transcript)


def test_the_example_project_trains_as_its_readme_shows(tmp_path, monkeypatch):
    """examples/my_project: its own model, data module and wrapper subclass, through python -m trainkit."""
    project = tmp_path / "my_project"
    left_by_earlier_tries = ("data", "runs")  # at the project's top level only: conf/data/ is part of it
    shutil.copytree(EXAMPLE_PROJECT, project, ignore=lambda folder, names: [
        name for name in names
        if name == "__pycache__" or (folder == str(EXAMPLE_PROJECT) and name in left_by_earlier_tries)])
    monkeypatch.chdir(project)
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    (transcript,) = [t for t in TRANSCRIPTS if t.page == EXAMPLE_PROJECT / "README.md"]
    run_transcript(transcript)
    run_dir = project / "runs" / "lines"
    for entry in (".hydra/config.yaml", "train.log", "metrics.jsonl", "tensorboard", "checkpoints/best.ckpt",
                  "checkpoints/best.json", "checkpoints/trainkit-8_15.ckpt"):  # the run directory the README lists
        assert (run_dir / entry).exists(), entry
    config = yaml.safe_load((run_dir / ".hydra" / "config.yaml").read_text())
    assert config["wrapper"]["_target_"] == "my_project.steps.ClampedGradients"
    assert config["model"]["_target_"] == "my_project.nets.LineNet"
    evaluations = [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
                   if "eval/accuracy" in r]
    assert evaluations[-1]["eval/accuracy"] >= 0.9  # three kinds of lines: easy once it trains
    # the project's callback logged the weights' norm at each epoch end: the last one is the final weights' norm
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    norms = [(r["step"], r["custom/weight_norm"]) for r in records if "custom/weight_norm" in r]
    assert [step for step, _ in norms] == [15 * epoch for epoch in range(1, 9)]
    final = ms.load_checkpoint(str(run_dir / "checkpoints" / "trainkit-8_15.ckpt"))
    trainable = [name for name in final if name.startswith(("features.", "classifier."))]  # LineNet's weights
    weights = sum(float((final[name].asnumpy().astype(np.float64) ** 2).sum()) for name in trainable)
    assert norms[-1][1] == pytest.approx(np.sqrt(weights), rel=1e-6)


def test_a_transcript_parses_into_commands_output_and_status():
    commands = parse("$ python -m trainkit a=1\nline one\n...\n$ echo $?\n2\n$ python -m trainkit 'b=x y'\n")
    assert [c.argv for c in commands] == [["python", "-m", "trainkit", "a=1"], ["python", "-m", "trainkit", "b=x y"]]
    assert commands[0].shown == ["line one", "..."] and commands[0].expected_status() == 2
    assert commands[1].expected_status() == 0
    assert parse("$ python -m trainkit x\ntrainkit: error: bad x\n")[0].expected_status() == 2


def test_shown_lines_match_printed_lines_in_order_with_elisions():
    printed = ["[a][trainkit][INFO] - start", "x", "trainkit: error: data.root=/tmp/q is missing"]
    assert unmatched(["...", "trainkit: error: data.root=... is missing"], printed) == []
    assert unmatched(["trainkit: error: data.root=/tmp/q is missing", "[...] - start"], printed) == ["[...] - start"]
    assert unmatched(["trainkit: error: data.root=/tmp/q"], printed) == ["trainkit: error: data.root=/tmp/q"]
