"""data=table's splits without training: test_fraction=0 holds no rows out."""
import pytest

from tests.common.tables import rows, write_csv
from trainkit.data.table import TableData
from trainkit.errors import ConfigError


def test_test_fraction_zero_holds_no_rows_out_for_a_test_set(tmp_path):
    """Mutation caught: a test row per class held out anyway (max(1, ...)), or test_fraction=0 refused."""
    data = TableData(write_csv(tmp_path / "t.csv", rows()), "species", test_fraction=0, val_fraction=0.2)
    data.prepare()
    assert not data.has_test_set
    sizes = {split: len(data.split_arrays(split)[1]) for split in ("train", "val", "test")}
    assert sizes["test"] == 0 and sizes["train"] + sizes["val"] == 60 and sizes["val"] == 12  # 0.2 of each class
    with pytest.raises(ConfigError, match="no test split"):
        data.test_dataset()
    with pytest.raises(ConfigError, match=r"test_fraction must be a number in \[0, 1\)"):
        TableData(tmp_path / "t.csv", "species", test_fraction=-0.5)
