"""The GPUs of this host: the one reader of nvidia-smi.

What nvidia-smi lists (index, UUID, name, compute capability, memory) and what CUDA_VISIBLE_DEVICES leaves visible
to a CUDA process, in CUDA's order. The profile choice (profiles.detect_gpu: the visible GPUs' compute capability)
and the multi-GPU checks (parallel.Context, preflight's G33-G38 and G42 rows) read the same answer the same way.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gptoss_patch.errors import cause


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    name: str
    capability: str
    memory_mib: int | None  # None where nvidia-smi reports [N/A] (GB10's unified memory)

    @property
    def memory_gib(self) -> float | None:
        return None if self.memory_mib is None else self.memory_mib / 1024

    @property
    def label(self) -> str:
        return f"{self.name} ({self.capability})"


@dataclass(frozen=True)
class Inventory:
    """What nvidia-smi lists and what CUDA_VISIBLE_DEVICES leaves visible, in CUDA's order."""

    gpus: tuple[Gpu, ...] = ()  # every GPU nvidia-smi lists
    visible: tuple[Gpu, ...] = ()  # what a CUDA process sees
    problem: str | None = None  # why nvidia-smi's answer could not be read
    duplicates: tuple[str, ...] = ()  # CUDA_VISIBLE_DEVICES entries naming a GPU already listed
    invalid: str | None = None  # the first entry CUDA cannot resolve: it and every later entry are dropped
    visible_env: str | None = None  # CUDA_VISIBLE_DEVICES as set, None when unset
    pci_order: bool = False  # CUDA_DEVICE_ORDER=PCI_BUS_ID: CUDA's indices are nvidia-smi's

    @property
    def mixed(self) -> bool:
        return len({(g.name, g.capability) for g in self.gpus}) > 1


GPU_QUERY = "index,uuid,name,compute_cap,memory.total"


def inventory(environ: Mapping[str, str], *, run: Callable[..., subprocess.CompletedProcess] | None = None) -> Inventory | None:
    """nvidia-smi's GPUs and the visible selection; None without nvidia-smi (no NVIDIA GPU to check). `run` stands in
    for subprocess.run in tests."""
    run = subprocess.run if run is None else run
    exe = shutil.which("nvidia-smi", path=environ.get("PATH"))
    if exe is None:
        return None
    try:
        proc = run([exe, f"--query-gpu={GPU_QUERY}", "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Inventory(problem=f"nvidia-smi failed ({cause(exc)})")
    if proc.returncode != 0:
        return Inventory(problem="nvidia-smi failed: " + (proc.stderr.strip().splitlines() or ["no output"])[0])
    gpus, problem = parse_gpus(proc.stdout)
    if problem:
        return Inventory(gpus=gpus, problem=problem)
    return select_visible(gpus, environ)


def parse_gpus(text: str) -> tuple[tuple[Gpu, ...], str | None]:
    gpus: list[Gpu] = []
    for line in (line.strip() for line in text.splitlines()):
        if not line:
            continue
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) != 5 or not cells[0].isdigit():
            return tuple(gpus), f"unexpected nvidia-smi line {line!r}"
        memory = cells[4]
        gpus.append(Gpu(int(cells[0]), cells[1], cells[2], cells[3], int(float(memory)) if _number(memory) else None))
    return tuple(gpus), None


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def select_visible(gpus: tuple[Gpu, ...], environ: Mapping[str, str]) -> Inventory:
    """CUDA_VISIBLE_DEVICES as CUDA reads it: indices or (prefixes of) UUIDs, in the order given; the first entry
    it cannot resolve hides itself and everything after it. Indices follow CUDA_DEVICE_ORDER, which is
    FASTEST_FIRST by default: only with PCI_BUS_ID (or identical GPUs) are they nvidia-smi's indices."""
    pci_order = environ.get("CUDA_DEVICE_ORDER", "") == "PCI_BUS_ID"
    value = environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return Inventory(gpus, gpus, pci_order=pci_order)
    chosen: list[Gpu] = []
    duplicates: list[str] = []
    invalid = None
    for entry in (e.strip() for e in value.split(",")):
        gpu = _resolve(entry, gpus)
        if gpu is None:
            invalid = entry
            break
        if gpu in chosen:
            duplicates.append(entry)
            continue
        chosen.append(gpu)
    return Inventory(gpus, tuple(chosen), duplicates=tuple(duplicates), invalid=invalid, visible_env=value, pci_order=pci_order)


def _resolve(entry: str, gpus: tuple[Gpu, ...]) -> Gpu | None:
    if entry.isdigit():
        return next((g for g in gpus if g.index == int(entry)), None)
    if entry.startswith("GPU-") and len(entry) > 4:
        matches = [g for g in gpus if g.uuid.startswith(entry)]
        return matches[0] if len(matches) == 1 else None
    return None  # MIG-..., -1, empty: no whole GPU


# -- what vLLM and the recipe guide decide from a GPU's model and memory --------------------------------------

# vLLM's --max-num-batched-tokens and --max-num-seqs defaults for the API server (EngineArgs.get_batch_defaults,
# read on 0.16-0.33): 8192 / 1024 on GPUs of 70 GiB and more (not A100, not GB10), 2048 / 256 below.
LARGE_GPU_GIB = 70

# The recipe guide's fix for gpt-oss-120b on one 80 GB H100 (G37).
H100_80GB_MAX_GIB = 82  # nvidia-smi reports 81559 MiB for an H100 SXM/PCIe 80 GB; H100 NVL (94 GB) is not this case


def is_large_gpu(gpu: Gpu) -> bool:
    """vLLM's larger batch defaults: 70 GiB and more, not an A100, not GB10."""
    gib = gpu.memory_gib or 0
    return gib >= LARGE_GPU_GIB and "a100" not in gpu.name.lower() and gpu.capability != "12.1"


def is_h100_80gb(gpu: Gpu) -> bool:
    return gpu.capability == "9.0" and gpu.memory_gib is not None and gpu.memory_gib <= H100_80GB_MAX_GIB
