# The two fresh-machine commands of the README: `make demo` (the main job) and `make test`.
# `make check` is the fast inner loop: lint, types, and the tests that need no download (docs/development.md).
PYTHON ?= python3
VENV := .venv
# The tests of `make check`: none with a marker that stands for a download (tests/support/markers.py).
FAST_TESTS := not upstream and not harness and not server

.PHONY: demo test test-changed check bench matrix fuzz

# Two makes in one clone (make demo beside make test) would build .venv at once and break it: the second waits
# for the first under a lock (one line says so), then finds it built. The stamp is checked again inside the lock.
LOCKED = scripts/locked.sh .venv.lock

$(VENV)/.installed: pyproject.toml
	@$(LOCKED) $@ pyproject.toml -- sh -c '$(PYTHON) -m venv $(VENV) && $(VENV)/bin/pip install -q --upgrade pip && \
	    $(VENV)/bin/pip install -q -e ".[test]"'

$(VENV)/.dev-installed: $(VENV)/.installed
	@$(LOCKED) $@ $(VENV)/.installed -- $(VENV)/bin/pip install -q -e '.[dev]'

# The tests run offline against an empty cache: a test that needs a download and lacks its marker fails.
check: $(VENV)/.dev-installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	scratch="$$(mktemp -d "$${TMPDIR:-/tmp}/gptoss-patch-check.XXXXXX")" && trap 'rm -rf "$$scratch"' EXIT && \
	env -u GPTOSS_PATCH_WHEEL_CACHE GPTOSS_PATCH_CACHE="$$scratch/cache" XDG_CACHE_HOME="$$scratch/xdg" \
	    GPTOSS_PATCH_TEST_OFFLINE=1 PIP_NO_INDEX=1 PIP_FIND_LINKS= \
	    $(VENV)/bin/python -m pytest -p no:cacheprovider --hypothesis-profile check -m "$(FAST_TESTS)"

# The whole suite: the concurrent lanes of .ci/run (scripts/ci_lanes.py: `make check` and the slow tiers side by side,
# each test once) on the user's cache. With TEST_ARGS, those pytest arguments in one process beside the prewarm
# (PREWARM= turns the second process off; the lanes run theirs so, both cores busy without it).
PREWARM ?= --prewarm
ifeq ($(strip $(TEST_ARGS)),)
test: $(VENV)/.dev-installed
	$(VENV)/bin/python scripts/ci_lanes.py
else
test: $(VENV)/.installed
	$(VENV)/bin/python -m pytest $(PREWARM) $(TEST_ARGS)
endif

# A developer's loop: the test files that cover what changed since BASE (default HEAD), from docs/development.md's
# module -> tests table (scripts/changed_tests.py). CI always runs everything.
BASE ?= HEAD
test-changed: $(VENV)/.installed
	@files="$$($(VENV)/bin/python scripts/changed_tests.py $(BASE))"; \
	if [ -z "$$files" ]; then echo "test-changed: no test file covers the changes since $(BASE)"; \
	else echo "test-changed: $$(echo $$files | wc -w) test files"; $(VENV)/bin/python -m pytest $(TEST_ARGS) $$files; fi

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
