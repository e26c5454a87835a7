"""The benchmark command runs on tiny settings and writes its table (no timing is asserted: speed is not tested):
the step's, the loop's and the end-to-end rows here, the models' rows in test_bench_models.py."""
from tests.common.bench_smoke import check_smoke

#: Every row the bench has, split by the modules that make them (bench/__main__.py's MODULES).
STEP_ROWS = ("1", "2", "3", "4", "5", "8", "11")
MODEL_ROWS = ("6", "7", "9", "10", "12")


def test_the_two_halves_are_every_row_of_the_bench():
    from bench.__main__ import MODULES

    assert sorted(STEP_ROWS + MODEL_ROWS, key=int) == sorted({row for rows in MODULES.values() for row in rows},
                                                              key=int)


def test_bench_smoke_runs_the_step_loop_and_end_to_end_rows_and_writes_json_and_markdown(tmp_path):
    check_smoke(STEP_ROWS, tmp_path)
