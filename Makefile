# `make test` creates (or reuses) .venv, installs the pinned requirements, then runs ruff and pytest;
# `make run` starts the app on the shipped checkpoints.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test test-avx2 lint pytest bench clean run docker-test vendor

$(STAMP): requirements.txt requirements-dev.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -r requirements-dev.txt
	touch $@

# OpenSeadragon, the Slide page's deep-zoom viewer, from the npm registry (never committed; git ignores it).
OPENSEADRAGON := openseadragon@6.1.1
VIEWER := app/ui/vendor/openseadragon/openseadragon.min.js
$(VIEWER):
	@tmp=$$(mktemp -d); \
	if (cd $$tmp && npm pack --silent $(OPENSEADRAGON) >/dev/null 2>&1) && tar -xzf $$tmp/openseadragon-*.tgz -C $$tmp; then \
		mkdir -p app/ui/vendor && rm -rf app/ui/vendor/openseadragon && \
		cp -r $$tmp/package/build/openseadragon app/ui/vendor/ && cp $$tmp/package/LICENSE.txt app/ui/vendor/openseadragon/; \
	else echo "warning: npm could not fetch $(OPENSEADRAGON): the Slide page will say its viewer is missing"; fi; \
	rm -rf $$tmp

vendor: $(VIEWER)

test: lint pytest

lint: $(STAMP)
	$(BIN)/ruff check .

pytest: $(STAMP) vendor
	$(BIN)/python -m pytest -q

# The suite as an AVX2-only CPU runs it, on an AVX-512 machine: PyTorch's, oneDNN's, MKL's, OpenBLAS's, numpy's and
# our own kernels limited to AVX2 (numpy's float sums then group differently, as on such a CPU). Run it before
# committing from an AVX-512 machine: a number compared too tightly passes there and fails on AVX2 (docs/speed.md).
AVX2_ONLY := ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 \
	OPENBLAS_CORETYPE=Haswell NPY_DISABLE_CPU_FEATURES="X86_V4 AVX512_ICL AVX512_SPR" AAGC_NATIVE_MARCH=x86-64-v3
test-avx2: lint $(STAMP) vendor
	$(AVX2_ONLY) $(BIN)/python -c "import numpy; numpy.show_runtime()" | grep -A2 simd_extensions
	$(AVX2_ONLY) $(BIN)/python -m pytest -q $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/python -m benchmarks.train_step

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache

# The warm-up stores every shipped model's padding borders first, and app/server.py prepares the default page
# before it answers, so that the first visitor does not wait for either.
run: $(STAMP) vendor
	$(BIN)/python -m app.warm
	$(BIN)/streamlit run app/server.py

# Builds the image, runs it, checks its health and screenshots it (docker/test.sh says how, on machines without a registry).
docker-test:
	bash docker/test.sh
