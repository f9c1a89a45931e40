"""benchmarks/reader_cost.py: its memory readings see memory that is planted (its figures themselves
are measured by the scale task, never asserted)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from benchmarks.reader_cost import private_bytes, worker_growth
from tests.conftest import REPO

pytestmark = pytest.mark.cpu_only(reason="reads host process memory; runs nothing on a device")

MIB = 2**20


def test_the_private_memory_reading_sees_an_allocation() -> None:
    """50 MiB written by a fresh process shows as at least 45 MiB of its private memory."""
    code = (
        "from benchmarks.reader_cost import private_bytes\n"
        "before = private_bytes()\n"
        "held = b'\\x01' * (50 << 20)\n"
        "print((private_bytes() - before) / 2**20)\n"
    )
    grown = float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO).stdout)
    assert 45 <= grown < 60
    assert private_bytes() > 0


_HELD: list[bytes] = []


def _allocating_sample(index: int) -> tuple[str, int]:
    """A sample that makes its worker hold 50 MiB more from its first item on."""
    if not _HELD:
        _HELD.append(b"\x01" * (50 << 20))
    return "class0000/img0000000.png", 0


def test_a_loader_workers_growth_is_seen() -> None:
    assert worker_growth(_allocating_sample, 1024) >= 45 * MIB
    assert worker_growth(lambda index: ("class0000/img0000000.png", 0), 1024) < 10 * MIB
