# `make test` creates (or reuses) .venv, installs the pinned requirements, then runs ruff and pytest.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test lint pytest bench clean

$(STAMP): requirements.txt requirements-dev.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -r requirements-dev.txt
	touch $@

test: lint pytest

lint: $(STAMP)
	$(BIN)/ruff check .

pytest: $(STAMP)
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/python -m benchmarks.train_step

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache

.PHONY: run
run: $(STAMP)
	$(BIN)/streamlit run app/main.py
