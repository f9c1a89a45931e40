"""train.py on a chip that saturates (an Ascend 910A) goes as on one that does not (a 910B).

One float16 run shows both halves: test_efficientnet's backward overflows at the GradScaler's initial scale,
so epoch 0 skips a few updates (counted in summary.csv) and trains on; after the warm-up, ``--lr 100`` blows the
weights up and epoch 1's forward pass overflows, which stops the run with exit 3 and one line. On the 910B the
overflows are inf; on the 910A (the emulated npu posing as one) they are 65504 and a raised float-status flag.
Same skips, same losses, same stop, in one process and under torchrun.
"""

from __future__ import annotations

import functools
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.conftest import (
    CHIP_DEVICES,
    NPU_910A,
    assert_one_line_error,
    chip_device_flags,
    chip_environment,
    run_script,
    summary,
    torchrun,
    train_args,
)

LAUNCHES = ("one process", "torchrun")
STOP = "training stopped: the loss overflowed at epoch 1 step "


@functools.cache
def outcome(device_type: str, launch: str, data: Path) -> tuple[int, str, list[dict[str, str]], str]:
    """A float16 run's exit code, its error line, its summary rows and its stdout (one run per device and
    launch in a test process)."""
    out = Path(tempfile.mkdtemp(prefix="vtools-saturating-run-"))
    flags = ["--model", "test_efficientnet", "--epochs", "2", "--amp", "--amp-dtype", "float16", "--lr", "100"]
    args = train_args(data, out, "run", *flags, *chip_device_flags(device_type))
    if launch == "torchrun":
        args = torchrun(args)
    proc = run_script(args, env={**chip_environment(device_type), "OMP_NUM_THREADS": "1"}, timeout=300)
    try:
        line = assert_one_line_error(proc, 3, STOP) if launch == "one process" else _rank_line(proc.stderr)
        return proc.returncode, line, summary(out / "run"), proc.stdout
    finally:
        shutil.rmtree(out, ignore_errors=True)


def _rank_line(stderr: str) -> str:
    """Under torchrun the ranks' line (each rank says it; torchrun adds its own report of the exit)."""
    lines = [line for line in stderr.splitlines() if STOP in line]
    assert lines, stderr[-3000:]
    return lines[0][lines[0].index(STOP) :]


@pytest.mark.parametrize("device_type", CHIP_DEVICES)
def test_float16_overflows_skip_updates_then_stop_the_diverged_run(device_type: str, fashion4: Path) -> None:
    code, line, rows, stdout = outcome(device_type, "one process", fashion4)
    assert code == 3 and line.startswith(f"train.py: error: {STOP}"), line
    assert [row["epoch"] for row in rows] == ["0"] and int(rows[0]["skipped_updates"]) > 0
    saturates = device_type == NPU_910A
    assert ("(the chip saturates: its float-status flag rose in the forward pass" in line) == saturates
    assert ("overflow detected through the chip's float-status flag" in stdout) == saturates


@pytest.mark.npu_only(reason="compares the two emulated Ascend chips, the one that saturates and the one that does not")
@pytest.mark.parametrize("launch", LAUNCHES)
def test_a_910a_run_skips_and_stops_exactly_as_a_910b_run(launch: str, fashion4: Path) -> None:
    """Same exit code, same step in the same line (up to how the overflow showed), same skipped updates and
    losses; under torchrun, with two ranks on each chip."""
    ieee, saturating = outcome("npu", launch, fashion4), outcome(NPU_910A, launch, fashion4)
    assert ieee[0] == saturating[0] != 0
    assert ieee[1].split(" (", 1)[0] == saturating[1].split(" (", 1)[0]
    assert _without_timing(ieee[2]) == _without_timing(saturating[2])
    assert int(saturating[2][0]["skipped_updates"]) > 0


TIMING = ("img_per_sec", "epoch_seconds", "data_wait")  # the host's speed, not the chip's arithmetic


def _without_timing(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    return [{key: value for key, value in row.items() if key not in TIMING} for row in rows]
