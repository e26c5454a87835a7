# trainkit: `make help` lists the targets. Every target creates .venv and installs what it needs.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)
export GLOG_v := 3

.PHONY: help train test clean

help:  ## list the targets
	@grep -E '^[a-z]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-8s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	@rm -f $(VENV)/.installed-* && touch $@

train: $(STAMP)  ## train a small network with TrainingWrapper on generated data
	$(BIN)/python -m trainkit.quickstart

test: $(STAMP)  ## run the test suite
	$(BIN)/python -m pytest

clean:  ## remove the virtual environment and caches
	rm -rf $(VENV) .pytest_cache build *.egg-info
