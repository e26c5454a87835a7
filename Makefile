# trainkit: `make help` lists the targets. Every target creates .venv and installs what it needs.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml Makefile | cksum | cut -d' ' -f1)
export GLOG_v := 3

.PHONY: help train test test-fast bench lint docs docs-serve clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml Makefile
	@$(PYTHON) -c 'import sys; sys.exit(not (3, 9) <= sys.version_info[:2] <= (3, 12))' || \
	  { echo "trainkit needs Python 3.9-3.12 (MindSpore 2.10 wheels); run e.g. make $(MAKECMDGOALS) PYTHON=python3.11"; exit 1; }
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "Installing trainkit, MindSpore 2.10 and the test tools into $(VENV) (a minute or two on a new machine)..."
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,digits,torch,onnx]'  # torch: PyTorch (CPU build), torchvision, timm
	@rm -f $(VENV)/.installed-* && touch $@

train: $(STAMP)  ## train the quick-start recipe: a small CNN on the handwritten digits
	$(BIN)/python -m trainkit

test: $(STAMP)  ## run the test suite (two workers: the CI machine's two cores; a file's tests stay together)
	$(BIN)/python -m pytest -n 2 --dist loadfile

test-fast: $(STAMP)  ## run the unit tier only (pure logic: no training, no process), for quick feedback
	$(BIN)/python -m pytest -n 2 --dist loadfile -m 'unit and not slow' -q

bench: $(STAMP)  ## run the benchmarks (about 13 min on 2 cores), print the table, write results/bench.{json,md}
	$(BIN)/python -m pip install --quiet -e '.[bench]' || echo "PyTorch not installed: rows 6 and 9 skip their PyTorch part"
	$(BIN)/python -m bench $(BENCH_ARGS)

lint: $(STAMP)  ## check the code with ruff
	$(BIN)/python -m pip install --quiet ruff
	$(BIN)/python -m ruff check trainkit tests bench examples conftest.py

docs: $(STAMP)  ## build the docs site (MkDocs Material, strict) into site/
	$(BIN)/python -m mkdocs build --strict --site-dir site

docs-serve: $(STAMP)  ## preview the docs site at http://127.0.0.1:8000, rebuilt as you edit
	$(BIN)/python -m mkdocs serve

clean:  ## remove the virtual environment and caches
	rm -rf $(VENV) .pytest_cache build site *.egg-info
