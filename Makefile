# The README's two set-up commands: `make train` and `make test`. Each installs what it needs first.
PYTHON ?= python3
export SDL_AUDIODRIVER ?= dummy

.PHONY: install install-dev train test lint

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

test: lint
	$(PYTHON) -m pytest -q
