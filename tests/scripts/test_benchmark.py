"""``vtools benchmark`` (timm's benchmark.py) on cpu and the emulated npu: a row per model in timm's columns,
a failing model a row with its error, every timed step waiting for the device (an asynchronous slow kernel
on the emulator must show in the step time), the out-of-memory retry and --no-retry, timm's flags."""

from __future__ import annotations

import csv
import importlib.util
import json
from pathlib import Path

import pytest

from tests.conftest import DEVICE_TYPES, assert_usage_error, device_flags, run_script

QUICK = ["--img-size", "32", "-b", "4", "--num-warm-iter", "1", "--num-bench-iter", "3"]
TIMM_COLUMNS = [  # benchmark.py's row for --bench both, in its order (param_count moved to the end)
    "model",
    "infer_samples_per_sec",
    "infer_step_time",
    "infer_batch_size",
    "infer_img_size",
    "train_samples_per_sec",
    "train_step_time",
    "train_batch_size",
    "train_img_size",
    "param_count",
]


def benchmark(*flags: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    proc = run_script(["-m", "vtools", "benchmark", *flags], env=env)
    return proc.returncode, proc.stdout, proc.stderr


def printed_result(stdout: str) -> list[dict]:
    """The rows after ``--result``, as timm's bulk runner reads them."""
    found = json.loads(stdout.split("--result\n", 1)[1])
    return found if isinstance(found, list) else [found]


@pytest.mark.parametrize("device_type", DEVICE_TYPES)
def test_a_model_list_gives_a_row_per_model_in_timms_columns(device_type: str, tmp_path: Path) -> None:
    """Three models from a list file, both benchmarks: the two that exist are measured (fastest first), the
    misspelt one is a row naming its error; the file has timm's columns, then peak memory, device, precision."""
    import timm

    names = tmp_path / "models.txt"
    names.write_text("test_resnet\nno_such_model\ntest_vit\n")
    results = tmp_path / "speeds.csv"
    flags = ["--model-list", str(names), *QUICK, "--results-file", str(results), *device_flags(device_type)]
    code, out, err = benchmark(*flags)
    assert code == 0, err
    with results.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert {row["model"] for row in rows[:2]} == {"test_resnet", "test_vit"}
    assert float(rows[0]["infer_samples_per_sec"]) >= float(rows[1]["infer_samples_per_sec"])  # timm's order
    assert rows[2]["model"] == "no_such_model" and "no_such_model" in rows[2]["error"]
    header = list(rows[0])
    assert [column for column in header if column in TIMM_COLUMNS] == TIMM_COLUMNS
    assert {"infer_peak_mem_mb", "train_peak_mem_mb", "device", "precision", "error"} <= set(header)
    for row in rows[:2]:
        assert float(row["infer_samples_per_sec"]) > 0 and float(row["train_samples_per_sec"]) > 0
        assert row["infer_img_size"] == "32" and row["infer_batch_size"] == "4"
        params = sum(p.numel() for p in timm.create_model(row["model"]).parameters())
        assert float(row["param_count"]) == round(params / 1e6, 2)
        assert row["device"].split(":")[0] == device_type and row["precision"] == "float32"
        peak = row["train_peak_mem_mb"]
        assert (float(peak) > 0) if device_type != "cpu" else peak == ""  # torch measures no cpu peak
    assert printed_result(out) == json.loads(json.dumps(printed_result(out)))  # valid JSON after --result
    assert [row["model"] for row in printed_result(out)] == [row["model"] for row in rows]
    assert "no_such_model: failed:" in out


@pytest.mark.cpu_only(reason="which columns and values the flags give; the device paths: the test above")
def test_the_flags_reach_the_row(tmp_path: Path) -> None:
    """--bench train --detail: the three parts' times, which add up to the step; --num-classes: the head's
    size in param_count; --precision in the row; json results."""
    import timm

    results = tmp_path / "speeds.json"
    flags = ["--model", "test_resnet", "--bench", "train", "--detail", "--num-classes", "7", "--precision"]
    flags += ["bfloat16", "--results-file", str(results), "--results-format", "json", *QUICK, "--device", "cpu"]
    code, out, err = benchmark(*flags)
    assert code == 0, err
    (row,) = json.loads(results.read_text())
    assert not any(key.startswith("infer_") for key in row) and row["precision"] == "bfloat16"
    parts = row["train_fwd_time"] + row["train_bwd_time"] + row["train_opt_time"]
    assert parts == pytest.approx(row["train_step_time"], abs=0.01)
    params = sum(p.numel() for p in timm.create_model("test_resnet", num_classes=7).parameters())
    assert row["param_count"] == round(params / 1e6, 2)


SLOW_MS = 25
COUNTER_INSTALLED = any(importlib.util.find_spec(name) for name in ("deepspeed", "fvcore"))


@pytest.mark.npu_only(reason="the emulated npu runs a kernel asynchronously on request; cpu kernels end on return")
def test_each_timed_step_waits_for_the_device() -> None:
    """Each convolution returns at once but keeps the emulated device busy 25 ms: a timer that waits for the
    device counts 25 ms per convolution in every step; one that does not (timm's on anything but CUDA)
    counts only the launches. Removing the synchronize from the step's clock fails this test."""
    import timm

    convolutions = sum(1 for m in timm.create_model("test_resnet").modules() if m.__class__.__name__ == "Conv2d")
    env = {"VTOOLS_EMU_NPU_SLOW_OP": "aten::convolution_overrideable", "VTOOLS_EMU_NPU_SLOW_MS": str(SLOW_MS)}
    code, out, err = benchmark("--model", "test_resnet", "--bench", "inference", *QUICK, *device_flags("npu"), env=env)
    assert code == 0, err
    (row,) = printed_result(out)
    assert row["infer_step_time"] >= convolutions * SLOW_MS, (row, convolutions)
    assert row["infer_samples_per_sec"] <= 4 / (convolutions * SLOW_MS / 1000)


@pytest.mark.npu_only(reason="a batch past the emulated npu's 64 GiB fails before any memory is taken; cpu would try")
def test_out_of_memory_retries_smaller_batches_unless_no_retry() -> None:
    """An input that no batch fits (80 000 px images: 77 GB each): timm's retry steps the batch down to 1
    and each step is said; --no-retry tries once. Either way the model is a row with its error."""
    flags = ["--model", "test_resnet", "--bench", "inference", "--img-size", "80000", "-b", "4"]
    code, out, err = benchmark(*flags, *device_flags("npu"))
    assert code == 0, err
    said = [line for line in out.splitlines() if "retrying with" in line]
    assert [line.rsplit(" ", 1)[1] for line in said] == ["3", "2", "1"], out
    (row,) = printed_result(out)
    assert row["error"].startswith("OutOfMemoryError: NPU out of memory")
    code, out, err = benchmark(*flags, "--no-retry", *device_flags("npu"))
    assert code == 0 and "retrying with" not in out and "OutOfMemoryError" in printed_result(out)[0]["error"]


@pytest.mark.cpu_only(reason="argument checks, before any device is chosen")
@pytest.mark.parametrize(
    ("flags", "words"),
    [
        pytest.param(
            ["--bench", "profile"],
            "counts MACs with deepspeed or fvcore, neither installed: pip install fvcore",
            marks=pytest.mark.skipif(COUNTER_INSTALLED, reason="a MACs counter is installed here"),
        ),
        (["--torchscript"], "--torchscript"),
        (["--num-bench-iter", "0"], "--num-bench-iter must be 1 or more, got 0"),
        (["--model-list", "zz_nothing*"], "--model-list zz_nothing*: neither a file nor a wildcard"),
        (["--bench", "fast"], "--bench"),
    ],
)
def test_unusable_input_is_one_line(flags: list[str], words: str) -> None:
    assert_usage_error(run_script(["-m", "vtools", "benchmark", *flags, "--device", "cpu"]), words)


# where vtools benchmark's default is not timm's, and why (the three scripts make the same choice)
DEFAULTS_NOT_TIMMS = {
    "device": "auto: the available accelerator, where timm assumes cuda",
    "amp_dtype": "auto: bfloat16 where the device has it, else float16 (timm: float16)",
}


@pytest.mark.cpu_only(reason="option lists; nothing runs")
def test_every_timm_benchmark_option_parses_with_its_dest_and_default() -> None:
    """All 40 options of timm's benchmark.py, read out of timm's script (tests/data/timm_options.json)."""
    from tests.timm_reference import timm_options
    from vtools.cli.benchmark_flags import build_parser

    parser = build_parser()
    options = timm_options("benchmark.py")
    assert len(options) == 40
    for option in options:
        ours = next(action for action in parser._actions if option["flags"][0] in action.option_strings)
        assert set(option["flags"]) <= set(ours.option_strings) and ours.dest == option["dest"], option
        if option["dest"] not in DEFAULTS_NOT_TIMMS:
            assert ours.default == option["default"], option


@pytest.mark.cpu_only(reason="names against timm's optimizer registry; nothing runs")
def test_an_unknown_optimizer_is_named_whole() -> None:
    """timm reads only the part after the last underscore (``nonexistent_opt``: "Optimizer opt not found");
    the refusal names what was given. Its lookahead_ form is timm's and passes."""
    from vtools.errors import UsageError
    from vtools.evaluation.speed import check_optimizer

    check_optimizer("lookahead_adamw")
    check_optimizer("AdamW")
    for name, words in [("nonexistent_opt", "--opt nonexistent_opt: not"), ("adamx", "did you mean adamax?")]:
        with pytest.raises(UsageError, match=words):
            check_optimizer(name)
