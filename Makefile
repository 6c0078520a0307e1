# The README's set-up commands: `make train`, `make test` and `make test-fast`. Each installs what it needs first.
PYTHON ?= python3
export SDL_AUDIODRIVER ?= dummy

.PHONY: install install-dev train test test-fast lint mutation

install:
	$(PYTHON) -m pip install -q -r requirements.txt
	$(PYTHON) -m pip install -q --no-deps -r requirements-nodeps.txt

install-dev: install
	$(PYTHON) -m pip install -q -r requirements-dev.txt

train: install
	$(PYTHON) train.py --config configs/poc_memory_env.yaml --run-id poc --overwrite

lint: install-dev
	$(PYTHON) -m ruff check .
	$(PYTHON) -m ruff format --check .

# The whole suite (what CI runs), on two processes.
test: lint
	$(PYTHON) -m pytest -q -n 2

# The loop while editing: the tests not marked slow (no training runs, no scripts started as subprocesses), on two
# processes; `make test` (what CI runs) is the whole suite.
test-fast: install-dev
	$(PYTHON) -m pytest -q -m "not slow" -n 2

# Mutation testing of the core's numerics (docs/testing.md#mutation-testing), not part of `make test`: mutmut's
# mutants of the losses, GAE, masks and normalisation against their unit tests, one process (3-7 minutes on the
# shared 2-core machine), then the counts and each surviving mutant's diff. mutmut is installed here, not in requirements-dev.txt:
# it brings textual, libcst and coverage, which `make test` does not need.
mutation: install-dev
	$(PYTHON) -m pip install -q mutmut==3.8.1
	$(PYTHON) -m lab.mutation
