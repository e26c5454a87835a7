"""trainkit's benchmarks: `python -m bench` (or `make bench`) measures every row of issue 7 and writes results/."""
