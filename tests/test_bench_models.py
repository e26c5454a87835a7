"""The benchmark command's model rows on tiny settings (test_bench.py has the others)."""
from tests.common.bench_smoke import check_smoke
from tests.test_bench import MODEL_ROWS


def test_bench_smoke_runs_the_model_rows_and_writes_json_and_markdown(tmp_path):
    check_smoke(MODEL_ROWS, tmp_path)
