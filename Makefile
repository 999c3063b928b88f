# tilefuse: two commands. `make demo` runs the main job, `make test` the test suite.
# Each sets itself up on a fresh machine (a virtual environment in .venv; on a machine with no GPU
# it installs the CPU build of torch 2.13.0 and triton 3.7.1; where torch is already importable
# with CUDA, as on the GPU image, it uses the system Python as it is).
PY ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

ifeq ($(shell $(PY) -c "import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null && echo gpu),gpu)
RUN := PYTHONPATH=$(CURDIR) $(PY)
SETUP :=
else
RUN := $(VENV)/bin/python
SETUP := $(STAMP)
endif

.PHONY: demo test test-all lint setup clean
setup: $(SETUP)

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q "torch==2.13.0"
	$(VENV)/bin/pip install -q "triton==3.7.1" "pandas>=2.0" numpy pytest pytest-timeout "ruff==0.17.6" transformers matplotlib tqdm
	$(VENV)/bin/pip install -q --no-deps -e .
	touch $(STAMP)

demo: $(SETUP)  # examples/demo.py starts torchrun: a rank per GPU, or two ranks
	$(RUN) examples/demo.py

PYTEST_MARK ?= not slow

test: $(SETUP)
	$(RUN) -m pytest -q -m "$(PYTEST_MARK)"

test-all: $(SETUP)
	$(RUN) -m pytest -q

lint: $(SETUP)
	$(RUN) -m ruff check tilefuse tests benchmarks examples

clean:
	rm -rf $(VENV) .pytest_cache
