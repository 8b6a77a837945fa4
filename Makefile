# Two entry points: `make dev` (local stack + demo model) and `make test` (lint,
# types, all tests on the real local stack). Both install what they need.
SHELL := /bin/bash
export UV_PYTHON_DOWNLOADS := never
export UV_VERSION := 0.13.8
VENV := .venv/bin
# Go from the Go module proxy when the machine has none recent enough
# (deploy/local/install-prerequisites.sh): first on PATH for every build script
export PATH := $(or $(KAMA_CACHE_DIR),$(HOME)/.cache/kama)/go/current/bin:$(PATH)

.PHONY: setup prerequisites deps binaries fresh-test helm images images-cuda dev test lint typecheck pytest newest-python bench matrix

setup: prerequisites deps binaries

# compilers, cmake, curl, git from Debian and Go from the Go module proxy, when missing
prerequisites:
	bash deploy/local/install-prerequisites.sh

deps:
	@command -v uv >/dev/null 2>&1 || bash deploy/local/install-prerequisites.sh uv
	uv sync --frozen --compile-bytecode

binaries: prerequisites
	bash deploy/local/build-k8s.sh >/dev/null
	bash deploy/local/build-llama.sh >/dev/null
	bash deploy/local/build-helm.sh >/dev/null
	bash deploy/local/build-node.sh >/dev/null

# Helm from its Go module, into ~/.cache/kama/helm/<version>/bin
helm:
	bash deploy/local/build-helm.sh

# Kama's OCI images (kama, kama-llama-server, kama-temporal-dev) without Docker, into
# ~/.cache/kama/images; prints each manifest digest (deploy/images/README.md)
images: deps
	bash deploy/images/build.sh

# kama-llama-server-cuda: llama-server built with CUDA 13 from NVIDIA's wheels on PyPI
# (deploy/local/build-llama-cuda.sh, about an hour on 2 cores), so not part of `images`,
# `test` or CI (deploy/images/README.md)
images-cuda: deps
	bash deploy/images/build.sh --cuda

dev: setup
	$(VENV)/python -m kamadev

lint: deps
	$(VENV)/ruff check .
	$(VENV)/ruff format --check .

typecheck: deps
	$(VENV)/mypy

# KEDA (needed only by the KEDA lane, which runs after the stack tests: tests/conftest.py)
# builds in the background at low priority while the earlier lanes run; its fixture waits
# for the build's lock. Every run writes its per-test durations (test-results/junit.xml)
# and prints the slowest 20 (python -m kamadev.slowest_tests test-results/junit.xml).
# The tests run on TEST_WORKERS pytest-xdist workers, a module at a time and in lane
# order (loadfile, no reordering); each worker that reaches the stack lane starts a
# stack of its own (its own octet, ports and nodes), so modules on different workers
# cannot disturb each other. A stack test waits on pods and Temporal about half the
# time, which the other worker's tests use.
TEST_WORKERS ?= 2
pytest: setup
	@mkdir -p test-results
	nice -n 10 bash deploy/local/build-keda.sh >test-results/build-keda.log 2>&1 &
	$(VENV)/pytest -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder \
		--junitxml=test-results/junit.xml
	$(VENV)/python -m kamadev.slowest_tests test-results/junit.xml

# the pure tests on the newest Python the package supports, and `uv tool install .`
newest-python: deps
	bash deploy/local/test-newest-python.sh

# the Python 3.13 lane runs beside pytest at low priority (it uses the CPU the stack
# tests leave while they wait on pods); its output follows pytest's, and either failing
# fails the run
test: lint typecheck deps
	@mkdir -p test-results
	@nice -n 10 bash deploy/local/test-newest-python.sh >test-results/newest-python.log 2>&1 & \
	newest=$$!; \
	$(MAKE) --no-print-directory pytest; tests=$$?; \
	wait $$newest; lane=$$?; \
	cat test-results/newest-python.log; \
	if [ $$lane -ne 0 ]; then echo "make test: the Python 3.13 lane failed (exit $$lane)"; fi; \
	exit $$(( tests != 0 || lane != 0 ))

# the chart's install-and-serve test on the oldest Kubernetes and the Helm major the
# chart could claim, built from Go modules (README, Install; not in CI)
matrix: setup
	bash deploy/local/test-matrix.sh

bench: setup
	$(VENV)/pytest -p no:cacheprovider -o python_files="bench_*.py" tests/bench -s

# the whole suite from a clean clone of HEAD with an empty HOME, set-up and test timed
# (deploy/local/fresh-test.sh; run before an issue is called resolved)
fresh-test:
	bash deploy/local/fresh-test.sh
