# Two commands on a fresh machine: `make run` (the default sweep) and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The CPU wheel on these machines; set TORCH_SPEC= to keep a torch you already have.
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.arxtune-installed
RDMA_STAMP := $(VENV)/.arxtune-rdma
# The rdma extra's pyverbs: the registry's source built once per version, Python and machine
# (arxtune/harness/pyverbs_wheel.py), kept in the user's cache as pip keeps the wheels it builds.
PYVERBS_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/arxtune/pyverbs

.PHONY: venv venv-rdma run lint test test-rdma test-vllm test-vllm-guest test-vllm-guest-engine test-gpu bench clean

venv: $(STAMP)

# .venv with the rdma extra: pyverbs with its own libibverbs (a few minutes the first time; needs gcc, python3-dev).
venv-rdma: $(RDMA_STAMP)

$(RDMA_STAMP): $(STAMP) arxtune/harness/pyverbs_wheel.py
	$(BIN)/python -m arxtune.harness.pyverbs_wheel build --cache $(PYVERBS_CACHE)
	$(BIN)/python -m pip install -q -e ".[test,rdma]" --find-links $(PYVERBS_CACHE)
	$(BIN)/python -c "import pyverbs.device"
	touch $(RDMA_STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(if $(TORCH_SPEC),$(BIN)/python -m pip install -q "$(TORCH_SPEC)")
	$(BIN)/python -m pip install -q -e ".[test]"
	touch $(STAMP)

# The default sweep without the isolated view, which would double it on a CPU machine.
run: venv
	$(BIN)/arxtune sweep --views eager,graph

# Lint and type check over arxtune/, tests/ (the GPU tier included) and benchmarks/, settings in pyproject.toml:
# the checks that catch what CI cannot run (a GPU test reading a renamed field). Seconds with mypy's cache,
# which lives in the user's cache so a fresh clone starts warm (mypy checks each file's hash against it).
MYPY_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/arxtune/mypy
lint: venv
	$(BIN)/ruff check arxtune tests benchmarks
	$(BIN)/ruff format --check arxtune tests benchmarks
	$(BIN)/mypy --cache-dir $(MYPY_CACHE)

# The tiers `make test` runs, cheapest first, after lint; each prints its wall time. Tiers are directories:
# tests/rdma/fake (a fake fabric) runs here, tests/rdma/device waits for `make test-rdma`.
test: venv lint
	$(BIN)/python -m pytest -q tests/unit
	$(BIN)/python -m pytest -q tests/multiproc
	$(BIN)/python -m pytest -q tests/rdma/fake

test-rdma: venv-rdma
	bash scripts/test-rdma.sh

test-vllm:
	bash scripts/test-vllm.sh

# The plugin routed to arx inside the soft-RoCE guest: 8 minutes more than CI's budget holds.
test-vllm-guest:
	bash scripts/test-vllm.sh --plugin-in-guest

# vLLM's engine inside the soft-RoCE guest with arx routed: too long for CI's budget.
test-vllm-guest-engine:
	bash scripts/test-vllm.sh --engine-in-guest

# The GPU tier uses whichever Python has CUDA torch: this venv's, or the machine's own python3.
GPU_PYTHON ?= $(shell test -x $(BIN)/python && echo $(BIN)/python || echo python3)
test-gpu:
	PYTHONPATH=$(CURDIR) $(GPU_PYTHON) -m pytest -q tests/gpu tests/rdma/fake/test_device_tensors_fake.py

bench: venv
	$(BIN)/python benchmarks/dispatch_overhead.py

clean:
	rm -rf $(VENV) .venv-vllm .cache
