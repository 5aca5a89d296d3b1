"""The recorded facts of each release (tests/launcher/facts/) that the pre-flight tests run on: complete, produced by
the static readers as they are now, facts only, and (slow tier) what the real wheels give today."""

from __future__ import annotations

import json

import pytest

from gptoss_patch import engine
from gptoss_patch.launcher import static
from gptoss_patch.versions import KNOWN_RELEASES
from tests.launcher import recorded
from tests.launcher.recorded import RecordedInstalls, facts, recorded_releases

REGENERATE = f".venv/bin/python {recorded.SCRIPT}"


def test_every_known_release_is_recorded():
    assert recorded_releases() == [str(v) for v in KNOWN_RELEASES], f"add the missing ones: {REGENERATE} VERSION"


@pytest.mark.parametrize("version", recorded_releases(), ids=lambda v: f"vllm-{v}")
def test_the_facts_were_produced_by_the_static_readers_as_they_are_now(version):
    """A change to launcher/static.py is followed by the facts it reads: regenerated, the tests on them see it."""
    produced = facts(version).raw["produced_by"]
    assert produced["reader"] == "src/gptoss_patch/launcher/static.py"
    assert produced["reader_sha256"] == recorded.reader_digest(), (
        f"tests/launcher/facts/{version}.json was recorded by another launcher/static.py: run {REGENERATE}"
    )
    assert facts(version).raw["release"] == version and facts(version).raw["format"] == recorded.FORMAT


@pytest.mark.parametrize("version", recorded_releases(), ids=lambda v: f"vllm-{v}")
def test_the_facts_are_names_and_hashes_never_source_text(version):
    raw = dict(facts(version).raw)
    raw.pop("note")  # ours
    strings = [value for value in _leaves(raw) if isinstance(value, str)]
    long = [value for value in strings if "\n" in value or len(value) > 200]
    assert strings and not long, long
    assert all(digest is None or len(digest) == 64 for digest in raw["inputs"].values())
    assert raw["inputs"][f"{raw['dist_info']}/METADATA"] and raw["inputs"]["vllm/envs.py"], "the inputs are recorded"


def _leaves(value):
    if isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from _leaves(item)
    elif isinstance(value, list):
        for item in value:
            yield from _leaves(item)
    else:
        yield value


@pytest.mark.parametrize("version", recorded_releases(), ids=lambda v: f"vllm-{v}")
def test_capabilities_round_trip_through_their_json(version):
    """Capabilities.to_json / from_json: the static cache's entry, and the recorded facts' format."""
    caps = facts(version).capabilities
    assert static.Capabilities.from_json(caps.version, json.loads(json.dumps(caps.to_json()))) == caps
    assert caps.to_json() == facts(version).raw["capabilities"]


def test_a_recorded_installation_answers_with_its_facts_and_others_are_read_as_before(tmp_path):
    installs = RecordedInstalls(lambda name: tmp_path / name)
    real = (static.read_capabilities, static.read_default_utilization, engine.status)
    with installs.answering():
        patched, stock = installs["0.22.1"], installs.stock("0.22.1")
        assert static.read_capabilities(patched.package_root, patched.version) == facts("0.22.1").capabilities
        assert static.read_default_utilization(stock.package_root) == facts("0.22.1").default_utilization == 0.92
        assert {r.id: r.state.value for r in engine.status(patched).results} == facts("0.22.1").states(patched=True)
        assert {r.id: r.state.value for r in engine.status(stock).results} == facts("0.22.1").states(patched=False)
        assert facts("0.22.1").states(patched=False)["harmony_instructions"] == "pending"
        assert facts("0.22.1").states(patched=True)["harmony_instructions"] == "applied"
        assert not list(patched.package_root.parent.glob("vllm")), "no vLLM file is laid out"
        assert static.read_default_utilization(tmp_path / "elsewhere") is None  # not recorded: the real reader
    assert (static.read_capabilities, static.read_default_utilization, engine.status) == real


@pytest.mark.upstream
@pytest.mark.parametrize("version", [str(v) for v in KNOWN_RELEASES], ids=lambda v: f"vllm-{v}")
def test_the_recorded_facts_are_what_the_wheel_gives(version):
    """Regenerated from the release's wheel (its files by range requests, checked against RECORD) with the real
    readers and engine, and compared with the committed file: the data cannot rot silently."""
    fresh = recorded.dumps(recorded.record(version))
    committed = recorded.path_of(version).read_text(encoding="utf-8") if recorded.path_of(version).exists() else ""
    if fresh != committed:
        now, then = json.loads(fresh), json.loads(committed or "{}")
        changed = sorted(key for key in now.keys() | then.keys() if now.get(key) != then.get(key))
        pytest.fail(f"tests/launcher/facts/{version}.json differs from what the vllm {version} wheel gives "
                    f"({', '.join(changed)}): run {REGENERATE} {version}, review the diff and commit it", pytrace=False)
