"""The tools' shared run: one digits run trained once per session (predict and export read it, never write)."""
import pytest

from tests.common.trained_digits import train_digits_run


@pytest.fixture(scope="session")
def digits_run(tmp_path_factory):
    return train_digits_run(tmp_path_factory.mktemp("digits_run") / "run")
