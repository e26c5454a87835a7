"""The benchmark command runs on tiny settings and writes its table (no timing is asserted: speed is not tested)."""
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_bench_smoke_runs_every_row_and_writes_json_and_markdown(tmp_path):
    out = tmp_path / "results"
    env = {**os.environ, "GLOG_v": "3", "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "bench", "--smoke", "--out", str(out)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    report = json.loads((out / "bench.json").read_text())
    rows = report["rows"]
    assert {row["row"] for row in rows} == {str(n) for n in range(1, 13)}
    for row in rows:
        assert "failed" not in row["name"], row
        for key in ("model", "batch", "image", "mode", "threads", "mindspore"):
            assert key in row["setup"], (row["name"], key)
        if row["value"] is None:  # skipped rows say why (PyTorch absent, a cell that does not run on this device)
            assert row["details"], row
    for key in ("mindspore", "threads", "load_average", "cpu_count"):
        assert key in report["environment"]
    markdown = (out / "bench.md").read_text()
    assert markdown.startswith("# trainkit benchmarks")
    assert markdown.count("\n| ") == len(rows) + 1  # the header and one line per row
    assert "smoke" in done.stdout
