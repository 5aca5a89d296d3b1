"""tests/support/servers.py's port choice: outside the kernel's ephemeral range, per lane, with bench's neighbours free."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.support import servers


def ephemeral_start() -> int:
    return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])


@pytest.mark.parametrize("lane", ["server", "harness", ""])
def test_ports_come_from_the_lanes_block_below_the_ephemeral_range(lane: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPTOSS_PATCH_LANE", lane)
    monkeypatch.setattr(servers, "_cursor", [])
    first, size = servers._port_block()
    assert size == servers.BLOCK_SIZE and first + size <= ephemeral_start()  # this machine's range starts at 32768
    ports = [servers.free_port() for _ in range(5)]
    assert all(first <= p and p + servers.NEIGHBOURS <= first + size for p in ports)
    assert len(set(ports)) == 5  # a run of ports, never the one just handed out


def test_blocks_of_different_lanes_do_not_overlap(monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = []
    for lane in (*servers.LANE_BLOCKS, "not-a-lane"):
        monkeypatch.setenv("GPTOSS_PATCH_LANE", lane)
        first, size = servers._port_block()
        blocks.append(range(first, first + size))
    assert all(not set(a) & set(b) for i, a in enumerate(blocks) for b in blocks[i + 1 :])


def test_a_port_whose_neighbour_is_held_is_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPTOSS_PATCH_LANE", "check")
    monkeypatch.setattr(servers, "_cursor", [])
    planned = servers.free_port() + servers.NEIGHBOURS  # where the cursor stands now
    with socket.socket() as held:
        held.bind(("127.0.0.1", planned + 1))  # bench's vanilla server would need it
        got = servers.free_port()
    assert got != planned and not got <= planned + 1 < got + servers.NEIGHBOURS
