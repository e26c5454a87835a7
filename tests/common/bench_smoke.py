"""`python -m bench --smoke --rows ...` run and its files checked (the smoke test is split in two files so that the
suite's two workers run the halves side by side: together they took 151 s, the suite's longest test)."""
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def check_smoke(rows, tmp_path: Path) -> None:
    out = tmp_path / "results"
    env = {**os.environ, "GLOG_v": "3", "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "bench", "--smoke", "--rows", ",".join(rows), "--out", str(out)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    report = json.loads((out / "bench.json").read_text())
    got = report["rows"]
    assert {row["row"] for row in got} == set(rows)
    for row in got:
        assert "failed" not in row["name"], row
        for key in ("model", "batch", "image", "mode", "threads", "mindspore"):
            assert key in row["setup"], (row["name"], key)
        if row["value"] is None:  # skipped rows say why (PyTorch absent, a cell that does not run on this device)
            assert row["details"], row
    for key in ("mindspore", "threads", "load_average", "cpu_count"):
        assert key in report["environment"]
    markdown = (out / "bench.md").read_text()
    assert markdown.startswith("# trainkit benchmarks")
    assert markdown.count("\n| ") == len(got) + 1  # the header and one line per row
    assert "smoke" in done.stdout
