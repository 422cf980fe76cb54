# make demo: the main job (CPU-sized, a few minutes). make test: the CPU test suite.
# Each creates and fills the virtual environment first when needed.
VENV ?= .venv
export VENV

.PHONY: env demo test test-gpu lint clean

env:
	@bash scripts/bootstrap.sh

demo: env
	$(VENV)/bin/mixzoo demo

test: env
	$(VENV)/bin/python -m pytest -q -m "not gpu"

test-gpu: env
	$(VENV)/bin/python -m pytest -q -m gpu

lint: env
	$(VENV)/bin/ruff check mixzoo tests

clean:
	rm -rf $(VENV) mixzoo-results .pytest_cache
