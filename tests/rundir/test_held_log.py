"""Log lines held until the input is accepted: a refusal leaves an earlier run's log byte for byte, a new log gets
the held lines and the error, an accepted run's log gets everything in order."""
import logging

import pytest

from trainkit.rundir import held_log


@pytest.fixture
def log_file(tmp_path):
    """A FileHandler on the root logger (as Hydra's train.log), removed afterwards; yields its path."""
    path = tmp_path / "train.log"

    def attach(existing: str):
        path.write_text(existing)
        handler = logging.FileHandler(path)
        handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
        logging.getLogger().addHandler(handler)
        logging.getLogger("trainkit").setLevel(logging.INFO)
        return path

    yield attach
    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, logging.FileHandler) or type(handler).__name__ == "_Holding":
            root.removeHandler(handler)
            getattr(handler, "target", handler).close()


def test_a_refusal_leaves_an_earlier_runs_log_as_it_was(log_file):
    path = log_file("INFO an earlier run\n")
    held_log.hold()
    logging.getLogger("trainkit").info("resume: data.split_seed was 0 in the checkpoint, now 3")
    held_log.drop(ValueError("refused"))
    logging.getLogger("trainkit").info("after the refusal")
    assert path.read_bytes() == b"INFO an earlier run\n"


def test_a_new_log_gets_the_held_lines_and_the_error(log_file):
    path = log_file("")
    held_log.hold()
    logging.getLogger("trainkit").info("one")
    held_log.drop(ValueError("refused"))
    assert path.read_text() == "INFO one\nERROR refused\n"


def test_an_accepted_run_gets_every_line_in_order_and_later_errors(log_file):
    path = log_file("INFO an earlier run\n")
    held_log.hold()
    logging.getLogger("trainkit").info("held")
    held_log.release()
    logging.getLogger("trainkit").info("direct")
    held_log.drop(ValueError("a bad batch"))  # after the release: the log is this run's
    assert path.read_text() == "INFO an earlier run\nINFO held\nINFO direct\nERROR a bad batch\n"
