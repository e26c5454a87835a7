"""Every console transcript in README.md and docs/ prints what it shows, with the exit status it implies."""
import pytest

from tests.common.transcripts import parse, run_in_process, transcripts, unmatched

TRANSCRIPTS = list(transcripts())


def test_the_docs_show_transcripts():
    assert len(TRANSCRIPTS) >= 3 and sum(len(t.commands) for t in TRANSCRIPTS) >= 10


@pytest.mark.parametrize("transcript", TRANSCRIPTS, ids=[t.name for t in TRANSCRIPTS])
def test_transcript_prints_what_the_docs_show(transcript, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # commands with relative paths (run directories, exports) share one folder
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    for command in transcript.commands:
        printed = run_in_process(command.argv)
        where = f"{transcript.name}: $ {' '.join(command.argv)}"
        assert "Traceback" not in printed.stderr, f"{where}\n{printed.stderr}"
        assert printed.status == command.expected_status(), f"{where}\n{printed.stdout}\n{printed.stderr}"
        missing = unmatched(command.shown, printed.lines)
        assert not missing, f"{where}: not printed: {missing}\nprinted:\n" + "\n".join(printed.lines)


def test_a_transcript_parses_into_commands_output_and_status():
    commands = parse("$ python -m trainkit a=1\nline one\n...\n$ echo $?\n2\n$ python -m trainkit 'b=x y'\n")
    assert [c.argv for c in commands] == [["python", "-m", "trainkit", "a=1"], ["python", "-m", "trainkit", "b=x y"]]
    assert commands[0].shown == ["line one", "..."] and commands[0].expected_status() == 2
    assert commands[1].expected_status() == 0


def test_shown_lines_match_printed_lines_in_order_with_elisions():
    printed = ["[a][trainkit][INFO] - start", "x", "trainkit: error: data.root=/tmp/q is missing"]
    assert unmatched(["...", "trainkit: error: data.root=... is missing"], printed) == []
    assert unmatched(["trainkit: error: data.root=/tmp/q is missing", "[...] - start"], printed) == ["[...] - start"]
    assert unmatched(["trainkit: error: data.root=/tmp/q"], printed) == ["trainkit: error: data.root=/tmp/q"]
