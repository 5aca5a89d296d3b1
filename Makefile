# The two fresh-machine commands of the README: `make demo` (the main job) and `make test`.
# `make check` is the fast inner loop: lint, types, and the tests that need no download (docs/development.md).
PYTHON ?= python3
VENV := .venv
# The tests of `make check`: none with a marker that stands for a download (tests/support/markers.py).
FAST_TESTS := not upstream and not harness and not server
# The rest. .ci/run runs `make check`, then `make test TEST_ARGS='-m "$(SLOW_TESTS)"'`: each test once.
SLOW_TESTS := upstream or harness or server

.PHONY: demo test check bench matrix fuzz

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[test]'
	touch $@

$(VENV)/.dev-installed: $(VENV)/.installed
	$(VENV)/bin/pip install -q -e '.[dev]'
	touch $@

# The tests run offline against an empty cache: a test that needs a download and lacks its marker fails.
check: $(VENV)/.dev-installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	scratch="$$(mktemp -d "$${TMPDIR:-/tmp}/gptoss-patch-check.XXXXXX")" && trap 'rm -rf "$$scratch"' EXIT && \
	env -u GPTOSS_PATCH_WHEEL_CACHE GPTOSS_PATCH_CACHE="$$scratch/cache" XDG_CACHE_HOME="$$scratch/xdg" \
	    GPTOSS_PATCH_TEST_OFFLINE=1 PIP_NO_INDEX=1 PIP_FIND_LINKS= \
	    $(VENV)/bin/python -m pytest -p no:cacheprovider --hypothesis-profile check -m "$(FAST_TESTS)"

test: $(VENV)/.installed
	$(VENV)/bin/python -m pytest --prewarm $(TEST_ARGS)

demo: $(VENV)/.installed
	$(VENV)/bin/python scripts/demo.py

bench: $(VENV)/.installed
	for b in bench/bench_*.py; do $(VENV)/bin/python $$b || exit 1; done

matrix: $(VENV)/.installed
	$(VENV)/bin/python scripts/compat_matrix.py

# The patched server under hostile requests and load, side by side with stock (docs/safety.md); FUZZ_ARGS, e.g.
# FUZZ_ARGS="--versions 0.17.1 --cases 200 --soak 300", changes the budget.
fuzz: $(VENV)/.installed
	$(VENV)/bin/python scripts/fuzz.py $(FUZZ_ARGS)
