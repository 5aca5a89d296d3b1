"""gptoss-patch's set-up for vLLM's own tests (copied as conftest.py next to them: tests/support/upstream_tests.py).

Runs in the target interpreter under pytest; imports only the standard library and pytest at module level.
It sets nothing that an upstream assertion reads. It does six things:

- for each LISTED row with `needs` ("module:name") that this release lacks, binds `name` in `module` (an empty
  stand-in module where the release has none: an older layout) to a placeholder that raises when called, so
  the test file imports; the row's tests are deselected here;
- for each Suite `moved` entry ("module:name", "source:name") whose name this release lacks, binds `name` in
  `module` (a stand-in module where the release has none) to the release's own object at `source`;
- for each Suite `keywords` entry ("module:Class", keyword, value) whose `Class.__init__` has no such parameter on
  this release (it has no such switch, and behaves as `value` does where there is one), drops that keyword from
  the calls when it carries `value` (any other value raises TypeError) and calls the release's own `__init__`;
- deselects the rows that never run (network, a device, a served model);
- for each Suite `settings` entry ("module:Class.name", ENV) in force on this release, gives the class a property
  `name`: a test that assigns the fixing release's option sets the patch's variable (JSON) instead, for that test;
- records every test's outcome (and the last line of a failure) as JSON at $GPTOSS_PATCH_UPSTREAM_RESULTS.

The environment (offline vocabulary, offline Hugging Face cache) is set by upstream_tests.run.
"""

from __future__ import annotations

import fnmatch
import functools
import importlib
import inspect
import json
import os
import sys
import types

NO_PLAN = '{"needs": [], "deselect": [], "settings": [], "moved": [], "keywords": []}'
PLAN = json.loads(os.environ.get("GPTOSS_PATCH_UPSTREAM_PLAN", NO_PLAN))
RESULTS: dict[str, list[str]] = {}
KEPT_OUT: list[list[str]] = []  # [pattern, why]
PLACEHOLDERS: set[str] = set()  # module:name bound here


def _placeholder(module: str, name: str):
    def absent(*_args, **_kwargs):
        raise NotImplementedError(f"{module}.{name} is not in this vLLM release (gptoss-patch's upstream-test shim)")

    absent.__name__ = name
    return absent


def _module(name: str):
    """The module, or where the release lacks it (an older layout), an empty stand-in under that name."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name != name and not name.startswith(f"{exc.name}."):  # not this module or a package above it
            raise
    parent, _, leaf = name.rpartition(".")
    module = sys.modules[name] = types.ModuleType(name)
    if parent:
        setattr(_module(parent), leaf, module)
    return module


for pattern, needs, why in PLAN["needs"]:
    module_name, _, name = needs.partition(":")
    module = _module(module_name)
    if not hasattr(module, name):
        setattr(module, name, _placeholder(module_name, name))
        PLACEHOLDERS.add(needs)
    if needs in PLACEHOLDERS:
        KEPT_OUT.append([pattern, f"{why} ({needs} is not in this release)"])
KEPT_OUT.extend(PLAN["deselect"])

for moved, source in PLAN.get("moved", []):
    module_name, _, name = moved.partition(":")
    module = _module(module_name)
    if not hasattr(module, name):
        source_module, _, source_name = source.partition(":")
        setattr(module, name, getattr(importlib.import_module(source_module), source_name))


def _without(init, owner: str, keyword: str, value):
    """`init` taking `keyword` as well, where the release has no such parameter: only `value` (what it behaves as)."""

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        if keyword in kwargs:
            given = kwargs.pop(keyword)
            if type(given) is not type(value) or given != value:
                raise TypeError(f"{owner} of this vLLM release has no {keyword}: it behaves as {keyword}={value!r} "
                                f"only, so {keyword}={given!r} cannot be set up (gptoss-patch's upstream-test shim)")
        init(self, *args, **kwargs)

    return __init__


for owner, keyword, value in PLAN.get("keywords", []):
    if owner in PLACEHOLDERS:  # a `needs` row's class this release lacks: its tests are deselected
        continue
    module_name, _, class_name = owner.partition(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    if keyword not in inspect.signature(cls.__init__).parameters:
        cls.__init__ = _without(cls.__init__, owner, keyword, value)


def _setting(name: str, env: str):
    """A property that keeps the value on the instance and puts it, as JSON, into `env` for the running test."""

    def get(self):
        return self.__dict__.get(f"_gptoss_patch_{name}")

    def put(self, value):
        self.__dict__[f"_gptoss_patch_{name}"] = value
        SET_ENV.add(env)
        os.environ[env] = json.dumps(value)

    return property(get, put)


SET_ENV: set[str] = set()  # variables a setting set during the running test
for attribute, env in PLAN.get("settings", []):
    module_name, _, qualified = attribute.partition(":")
    class_name, _, name = qualified.rpartition(".")
    setattr(getattr(importlib.import_module(module_name), class_name), name, _setting(name, env))


def pytest_runtest_teardown(item):
    while SET_ENV:
        os.environ.pop(SET_ENV.pop(), None)


def pytest_collection_modifyitems(config, items):
    kept, dropped = [], []
    for item in items:
        why = next((w for p, w in KEPT_OUT if fnmatch.fnmatchcase(item.nodeid, p)), None)
        if why is None:
            kept.append(item)
        else:
            dropped.append(item)
            RESULTS[item.nodeid] = ["deselected", why]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def pytest_collectreport(report):
    if report.failed:
        RESULTS[report.nodeid] = ["error", _last_line(report)]


def pytest_runtest_logreport(report):
    if report.failed:
        if RESULTS.get(report.nodeid, [""])[0] != "failed":  # a teardown error keeps the call's failure
            RESULTS[report.nodeid] = ["failed" if report.when == "call" else "error", _last_line(report)]
    elif report.skipped:
        RESULTS[report.nodeid] = ["skipped", _last_line(report)]
    elif report.when == "call":
        RESULTS[report.nodeid] = ["passed", ""]


def pytest_sessionfinish(session):
    path = os.environ.get("GPTOSS_PATCH_UPSTREAM_RESULTS")
    if path:
        with open(path, "w") as out:
            json.dump(RESULTS, out, indent=1, sort_keys=True)


def _last_line(report) -> str:
    lines = [line for line in str(report.longrepr or "").splitlines() if line.strip()]
    return lines[-1].strip()[:300] if lines else ""

