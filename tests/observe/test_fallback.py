"""Operators the backend runs on the host instead of the device: announced, counted, reported, fatal on request.

The emulated npu announces a host fallback for the operators in VTOOLS_EMU_NPU_FALLBACK_OPS in
torch_npu's words, on file descriptor 2 as torch_npu does (tests/emulated_npu/fallbacks.py);
vtools/observe/fallback.py counts them from there.
"""

from __future__ import annotations

import io
import os
import re
import subprocess
from pathlib import Path

import pandas as pd
import pytest
import timm
import torch

from tests.conftest import (
    DEVICE_TYPES,
    assert_one_line_error,
    device_flags,
    fashion_subset,
    load_emulated_npu,
    run_script,
    train_args,
)
from vtools.errors import RunFailed
from vtools.observe.fallback import CSV_NAME, FallbackWatch, announced_operators
from vtools.runtime import device as dev

FORWARD_OP = "aten::max_pool2d_with_indices"  # once per forward of test_resnet (its stem's max pool)
BACKWARD_OP = "aten::threshold_backward"  # ReLU's backward: runs in autograd's npu worker thread
TWO_OPS = f"{FORWARD_OP},{BACKWARD_OP}"
TORCH_NPU_LINE = re.compile(
    r"^\[W\d{4} [\d:.]+ compiler_depend\.ts:51\] Warning: CAUTION: The operator '(?P<op>[^']+)' is not currently "
    r"supported on the NPU backend and will fall back to run on the CPU\. This may have performance implications\. "
    r"\(function npu_cpu_fallback\)$"
)


def fallbacks_module():
    load_emulated_npu()
    from tests.emulated_npu import fallbacks

    return fallbacks


def small_model(device: torch.device) -> torch.nn.Module:
    torch.manual_seed(0)
    return timm.create_model("test_resnet", num_classes=4, in_chans=1).to(device)


def steps(model: torch.nn.Module, device: torch.device, count: int) -> None:
    for _ in range(count):
        model(torch.randn(2, 1, 28, 28, device=device)).sum().backward()


# ---------------------------------------------------------------- the emulator's side


@pytest.mark.npu_only(reason="the announcement and fault are the emulated npu's")
def test_the_emulator_announces_in_torch_npus_words_once_per_operator(capfd: pytest.CaptureFixture[str]) -> None:
    fallbacks = fallbacks_module()
    device = torch.device("npu")
    model = small_model(device)
    with fallbacks.falling_back([FORWARD_OP, BACKWARD_OP]):
        steps(model, device, 3)
        calls = fallbacks.calls(FORWARD_OP), fallbacks.calls(BACKWARD_OP)
    lines = [line for line in capfd.readouterr().err.splitlines() if "CAUTION" in line]
    assert [TORCH_NPU_LINE.match(line).group("op") for line in lines] == [FORWARD_OP, BACKWARD_OP], lines
    assert calls[0] == 3 and calls[1] > 3  # many calls, one announcement each, as torch_npu's has_op_name_warned
    assert fallbacks.configured() == sorted(fallbacks.KERNEL_WORDS)  # the block put the kernels back


@pytest.mark.npu_only(reason="the fault is the emulated npu's")
def test_the_numeric_fault_makes_one_operator_slightly_wrong() -> None:
    load_emulated_npu()
    from tests.emulated_npu import faults

    a, b = torch.randn(8, 8), torch.randn(8, 8)
    exact = a @ b
    with faults.faulty("aten::mm", scale=1e-2):
        faulty = (a.npu() @ b.npu()).cpu()
        added = (a.npu() + b.npu()).cpu()
    torch.testing.assert_close(faulty, exact * 1.01)
    torch.testing.assert_close(added, a + b)  # other operators are exact
    torch.testing.assert_close((a.npu() @ b.npu()).cpu(), exact)  # and mm again after the block


@pytest.mark.npu_only(reason="VTOOLS_EMU_NPU_CHIP is the emulated npu's")
def test_the_chip_name_as_torch_npu_reports_it() -> None:
    chips = (("910A", "Ascend910A False"), ("910B", "Ascend910B1 True"), ("910B3", "Ascend910B3 True"))
    each = (
        "import os, torch, tests.emulated_npu\n"
        f"for chip in {[chip for chip, _ in chips]!r}:\n"
        "    os.environ['VTOOLS_EMU_NPU_CHIP'] = chip\n"
        "    print(torch.npu.get_device_name(0), torch.npu.is_bf16_supported())\n"
    )
    proc = run_script(["-c", each])  # the chip is read at each call: one process for every chip
    assert proc.stdout.splitlines() == [expected for _, expected in chips], proc.stderr
    code = "import torch, tests.emulated_npu\nprint(torch.npu.get_device_name(0), torch.npu.is_bf16_supported())\n"
    proc = run_script(["-c", code], env={"VTOOLS_EMU_NPU_CHIP": "910C"})
    assert proc.returncode != 0 and "VTOOLS_EMU_NPU_CHIP must be one of" in proc.stderr
    proc = run_script(["-c", code], env={"VTOOLS_EMU_NPU_FALLBACK_OPS": "aten::linear"})
    assert proc.returncode != 0 and "never reaches the npu backend" in proc.stderr


# ---------------------------------------------------------------- the watch, in this process


def test_the_device_table_says_which_backends_announce_fallbacks() -> None:
    assert dev.kind_of("cpu").host_fallback == () and dev.kind_of("cuda").host_fallback == ()
    mps = (  # MPS's words (aten/src/ATen/mps/MPSFallback.mm), through Python's warnings
        "x.py:3: UserWarning: The operator 'aten::_unique2' is not currently supported on the MPS backend and "
        "will fall back to run on the CPU. This may have performance implications."
    )
    assert announced_operators(mps, [re.compile(p) for p in dev.kind_of("mps").host_fallback]) == ["aten::_unique2"]
    assert announced_operators(mps, [re.compile(p) for p in dev.kind_of("npu").host_fallback]) == []  # its own words


def test_every_announcement_counts() -> None:
    watch = FallbackWatch("npu")
    line = "[W1128 11:37:15.1 compiler_depend.ts:51] Warning: CAUTION: The operator '{}' is not currently supported on the NPU backend and will fall back to run on the CPU. This may have performance implications. (function npu_cpu_fallback)"  # noqa: E501
    for op in ("aten::a", "aten::b", "aten::a", "aten::a"):
        watch.feed(line.format(op))
    watch.feed("an ordinary line about aten::a")
    assert [(e.op, e.count) for e in watch.fallbacks()] == [("aten::a", 3), ("aten::b", 1)]
    assert watch.total == 4
    assert "aten::a       3" in watch.summary()


def test_the_capture_on_each_device(device: torch.device, capfd: pytest.CaptureFixture[str]) -> None:
    """On npu: the announcements of two operators, each at every call (so the counts are the calls), from
    the main thread (forward) and autograd's device thread (backward); on cpu nothing is watched."""
    model = small_model(device)
    watches_device = bool(dev.kind_of(device.type).host_fallback)
    if watches_device:
        fallbacks = fallbacks_module()
        with fallbacks.falling_back([FORWARD_OP, BACKWARD_OP], announce="always"):
            with FallbackWatch(device.type) as watch:
                steps(model, device, 3)
                os.write(2, b"a partial line, ")  # other output passes through untouched
                os.write(2, b"completed later\n")
            calls = {op: fallbacks.calls(op) for op in (FORWARD_OP, BACKWARD_OP)}
        assert {e.op: e.count for e in watch.fallbacks()} == calls
        assert calls[FORWARD_OP] == 3
        assert "cpu fallbacks: 2 operator(s)" in watch.summary()
        err = capfd.readouterr().err
        assert "a partial line, completed later\n" in err
        assert err.count("CAUTION") == sum(calls.values())  # the tee forwards what it counts
    else:
        with FallbackWatch(device.type) as watch:
            steps(model, device, 1)
        assert not watch.watching and watch.total == 0
        assert watch.summary().startswith("cpu fallbacks: 0")
    assert pd.read_csv(io.StringIO(watch.csv_text())).columns.tolist() == ["op", "count", "first_seen_at", "kind"]


@pytest.mark.npu_only(reason="only the emulated npu announces host fallbacks here")
def test_slow_paths_are_counted_apart_and_never_fatal(device: torch.device) -> None:
    """An integer sort runs on the npu's AI CPU (the emulator says so in torch_npu's words), a float64 cast
    line is fed by hand (the emulator keeps no float64 on the device): both counted as slow paths with their
    kind, in the file and the summary, not as host fallbacks, and a fatal watch does not stop for them. cpu has
    no slow path to watch."""
    with FallbackWatch(device.type, fatal=True) as watch:
        torch.tensor([3, 1, 2], device=device).argsort()
        torch.tensor([3.0, 1.0, 2.0], device=device).argsort()  # floating point: the AI Core's
        watch.feed("Device do not support double dtype now, dtype cast replace with float.")
    if not dev.kind_of(device.type).slow_paths:
        assert watch.slow_paths() == [] and not watch.watching
        return
    assert [(e.op, e.count, e.kind) for e in watch.slow_paths()] == [
        ("ArgSort", 1, "aicpu"),
        ("float64 as float32", 1, "float64 cast"),
    ]
    assert watch.fallbacks() == [] and watch.total == 0
    summary = watch.summary()
    assert summary.startswith("cpu fallbacks: 0") and "slow paths: 2 on the npu device itself" in summary
    table = pd.read_csv(io.StringIO(watch.csv_text()))
    assert table.kind.tolist() == ["aicpu", "float64 cast"]


def test_the_first_fallback_is_fatal_on_request() -> None:
    fallbacks = fallbacks_module()
    device = torch.device("npu")
    model = small_model(device)
    ran = 0
    with fallbacks.falling_back([BACKWARD_OP]), pytest.raises(RunFailed, match=BACKWARD_OP) as raised:
        with FallbackWatch("npu", fatal=True):
            for _ in range(20):
                steps(model, device, 1)
                ran += 1
    assert ran <= 1, "the run went on after the fallback"
    assert "tests/observe/test_fallback.py" in str(raised.value)  # where the run was: this file's backward() call


# ---------------------------------------------------------------- train.py and validate.py


def _lines_per_op(stderr: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for line in stderr.splitlines():
        if match := TORCH_NPU_LINE.match(line):
            counts[match.group("op")] = counts.get(match.group("op"), 0) + 1
    return counts


def _fallback_env(announce: str = "once", ops: str | None = TWO_OPS) -> dict[str, str | None]:
    return {"VTOOLS_EMU_NPU_FALLBACK_OPS": ops, "VTOOLS_EMU_NPU_FALLBACK_ANNOUNCE": announce}


@pytest.mark.npu_only(reason="only the emulated npu announces host fallbacks here")
def test_training_reports_each_fallback_with_its_count(fashion4: Path, tmp_path: Path) -> None:
    args = train_args(fashion4, tmp_path, "run", *device_flags("npu"), "--epochs", "1")
    proc = run_script(args, env=_fallback_env("always"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    announced = _lines_per_op(proc.stderr)
    assert set(announced) == {FORWARD_OP, BACKWARD_OP} and min(announced.values()) > 1
    table = pd.read_csv(tmp_path / "run" / CSV_NAME)
    assert dict(zip(table.op, table["count"])) == announced  # every announcement counted
    assert table.first_seen_at[table.op == FORWARD_OP].item().startswith("timm/models/resnet.py:")
    report = proc.stdout[proc.stdout.index("cpu fallbacks:") :]
    assert "cpu fallbacks: 2 operator(s)" in report
    for op, count in announced.items():
        assert re.search(rf"{re.escape(op)}\s+{count}\s+first at", report), report


@pytest.mark.npu_only(reason="only the emulated npu announces host fallbacks here")
def test_no_cpu_fallback_stops_at_the_first(fashion4: Path, tmp_path: Path) -> None:
    args = train_args(fashion4, tmp_path, "run", *device_flags("npu"), "--epochs", "1", "--no-cpu-fallback")
    proc = run_script(args, env=_fallback_env())
    line = assert_one_line_error(proc, 3, "--no-cpu-fallback", FORWARD_OP, "announced while the run was at")
    assert BACKWARD_OP not in line
    assert not (tmp_path / "run").exists()  # nothing saved: the failed start leaves no folder


# timm's HaloNet: its attention cuts key/value blocks with Tensor.unfold, whose backward torch_npu 2.14.0 runs on
# the host with a sentence of its own (unquoted, "is currently not supported ... will fallback"), not the boxed one
HALO_MODEL, HALO_OP = "halonet26t", "aten::unfold_backward"


@pytest.mark.npu_only(reason="only the emulated npu announces host fallbacks here")
def test_a_timm_model_reaching_a_kernels_own_fallback_is_named_and_stopped(tmp_path: Path) -> None:
    """No operator listed: the emulator falls back where torch_npu itself does, in its words."""
    data = fashion_subset(tmp_path / "data", 2, 1)  # 8 images, two steps of four at the model's 256 px

    def halo_run(name: str, *extra: str) -> subprocess.CompletedProcess:
        flags = ["--model", HALO_MODEL, "--img-size", "256", "--epochs", "1", "--batch-size", "4", *extra]
        return run_script(train_args(data, tmp_path, name, *device_flags("npu"), *flags), env=_fallback_env(ops=None))

    proc = halo_run("counted")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "CAUTION: The operator aten::unfold_backward is currently not supported on the NPU backend." in proc.stderr
    table = pd.read_csv(tmp_path / "counted" / CSV_NAME)
    assert table.op.tolist() == [HALO_OP] and table["count"].tolist() == [1]
    assert re.search(rf"cpu fallbacks: 1 operator.*\n\s+{HALO_OP}\s+1\s+first at", proc.stdout)
    stopped = halo_run("stopped", "--no-cpu-fallback")
    assert_one_line_error(stopped, 3, "--no-cpu-fallback", f"ran {HALO_OP} on the host CPU")
    assert not (tmp_path / "stopped").exists()


@pytest.mark.parametrize("device_type", DEVICE_TYPES)
def test_a_run_without_fallbacks_reports_zero(device_type: str, fashion4: Path, tmp_path: Path) -> None:
    args = train_args(fashion4, tmp_path, "run", *device_flags(device_type), "--epochs", "1", "--no-cpu-fallback")
    proc = run_script(args, env={"VTOOLS_EMU_NPU_FALLBACK_OPS": None})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "cpu fallbacks: 0" in proc.stdout
    assert pd.read_csv(tmp_path / "run" / CSV_NAME).empty


@pytest.mark.npu_only(reason="only the emulated npu announces host fallbacks here")
def test_validate_reports_fallbacks(custom_images: Path, custom_model_dir: Path, tmp_path: Path) -> None:
    results = tmp_path / "results.csv"
    proc = run_script(
        ["validate.py", str(custom_images), *device_flags("npu"), "--model", str(custom_model_dir)]
        + ["--results-file", str(results)],
        env=_fallback_env(),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = pd.read_csv(tmp_path / f"results.{CSV_NAME}")
    assert table.op.tolist() == [FORWARD_OP] and table["count"].tolist() == [1]  # no backward in validation
    assert re.search(rf"cpu fallbacks: 1 operator.*\n\s+{re.escape(FORWARD_OP)}\s+1\s+first at", proc.stdout)
