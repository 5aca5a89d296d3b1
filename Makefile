# The two fresh-machine commands of the README: `make demo` (the main job) and `make test`.
PYTHON ?= python3
VENV := .venv

.PHONY: demo test bench matrix

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[test]'
	touch $@

test: $(VENV)/.installed
	$(VENV)/bin/python -m pytest

demo: $(VENV)/.installed
	$(VENV)/bin/python scripts/demo.py

bench: $(VENV)/.installed
	for b in bench/bench_*.py; do $(VENV)/bin/python $$b || exit 1; done

matrix: $(VENV)/.installed
	$(VENV)/bin/python scripts/compat_matrix.py
