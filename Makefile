# `make test` creates (or reuses) .venv, installs the pinned requirements, then runs ruff and pytest;
# `make run` starts the app on the shipped checkpoints.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test lint pytest bench clean run docker-test

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

# The warm-up stores every shipped model's padding borders first, so that the first visitor does not wait for them.
run: $(STAMP)
	$(BIN)/python -m app.warm
	$(BIN)/streamlit run app/main.py

# Builds the image, runs it, checks its health and screenshots it (docker/test.sh says how, on machines without a registry).
docker-test:
	bash docker/test.sh
