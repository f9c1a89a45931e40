"""vtools parity --train: train.py's own step on the emulated npu against the cpu (vtools/train/parity_recipe.py).

The emulator runs the cpu's kernels, so with the device defaults forced equal the two sides must agree to the
bit; a weight decay that only the npu's optimizer gets must fail, named at the first weight it changes.
"""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest
import torch

from tests.conftest import REPO
from vtools.cli.train_flags import parse
from vtools.cli.typed import typed_options
from vtools.errors import RunFailed, UsageError
from vtools.observe import parity
from vtools.options.train_job import TrainJob
from vtools.runtime.amp import resolve_amp
from vtools.runtime.device import resolve_device
from vtools.runtime.resolve import setup_runtime
from vtools.train import parity_recipe, recipe

STEPS = 3
BOTH = "compares the cpu with the emulated npu itself"


def _run(data: Path, *extra: str) -> tuple[list[str], list[parity.Entry]]:
    """The quick-start recipe on ``data`` with a tiny model, npu against cpu: the lines said and the entries."""
    argv = ["-c", str(REPO / "configs/fashion_mnist_cpu.yaml"), "--data-dir", str(data), "--model", "test_resnet"]
    job = typed_options(TrainJob, parse([*argv, "--device", "npu", *extra]))
    runtime = setup_runtime(job.runtime)
    cpu = resolve_device("cpu")
    tols = parity.default_tolerances(runtime.amp.dtype_name)
    lines: list[str] = []
    entries = parity_recipe.run(
        job, runtime.device, runtime.amp, cpu, resolve_amp(cpu, False), STEPS, tols, say=lines.append
    )
    return lines, entries


def _plant_weight_decay(monkeypatch: pytest.MonkeyPatch, factor: float) -> None:
    """The npu's optimizer alone gets ``factor`` times the recipe's weight decay (a test-side plant)."""
    build = recipe.build_optimizer

    def planted(model: torch.nn.Module, optim: object, lr: float) -> torch.optim.Optimizer:
        optimizer = build(model, optim, lr)
        if next(model.parameters()).device.type == "npu":
            for group in optimizer.param_groups:
                group["weight_decay"] *= factor
        return optimizer

    monkeypatch.setattr(recipe, "build_optimizer", planted)


@pytest.mark.cpu_only(reason=BOTH)
def test_the_same_recipe_steps_to_the_same_bits(fashion4: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    build, fused = recipe.build_optimizer, {}

    def noted(model: torch.nn.Module, optim: object, lr: float) -> torch.optim.Optimizer:
        optimizer = build(model, optim, lr)
        fused[next(model.parameters()).device.type] = recipe.fused_step(optimizer)
        return optimizer

    monkeypatch.setattr(recipe, "build_optimizer", noted)
    lines, entries = _run(fashion4)
    assert fused == {"cpu": False, "npu": False}  # the cpu's default is the fused step: forced off
    assert "forced equal on both sides: channels-last off, fused optimizer step off" in lines[0]
    assert parity.first_failure(entries) is None
    assert {entry.step for entry in entries} == {1, 2, 3}
    # the emulator runs the cpu's kernels: equal bits, alone (in a process where tests/emulated_npu/faults.py planted a
    # fault before, the npu's backward afterwards parts from the cpu's by up to 4e-4 of an update: within tolerance)
    assert all(entry.max_rel_err == 0.0 for entry in entries if entry.step == 1 and entry.phase in ("forward", "loss"))
    first = entries[0]
    assert (first.phase, first.layer, first.shape) == ("forward", parity_recipe.BATCH, (64, 3, 32, 32))
    phases = {entry.phase for entry in entries}
    assert phases == {"forward", "loss", "backward", "update"}
    assert parity_recipe.verdict(entries, STEPS).startswith("parity: pass (")


@pytest.mark.cpu_only(reason=BOTH)
def test_the_ema_change_and_clipping_are_compared(fashion4: Path) -> None:
    lines, entries = _run(fashion4, "--model-ema", "--model-ema-decay", "0.5", "--clip-grad", "0.5", "--mixup", "0.2")
    assert parity.first_failure(entries) is None
    ema = [entry for entry in entries if entry.layer.startswith(parity_recipe.EMA_PREFIX)]
    assert ema and all(entry.phase == "update" for entry in ema)
    assert max(entry.ref_max_abs for entry in ema) > 0  # the EMA did move: its change is a real comparison


@pytest.mark.cpu_only(reason=BOTH)
@pytest.mark.parametrize("factor", [2.0, 0.0], ids=["doubled", "dropped"])
def test_a_weight_decay_only_the_npu_gets_fails_at_the_first_weight_it_changes(
    fashion4: Path, monkeypatch: pytest.MonkeyPatch, factor: float
) -> None:
    _plant_weight_decay(monkeypatch, factor)
    lines, entries = _run(fashion4)
    bad = parity.first_failure(entries)
    assert bad is not None
    assert (bad.step, bad.phase, bad.layer) == (1, "update", "fc.weight")  # backward's order: the head first
    before = entries[: entries.index(bad)]
    assert all(entry.ok for entry in before) and any(entry.phase == "backward" for entry in before)
    line = parity_recipe.verdict(entries, STEPS)
    assert line.startswith("parity: FAIL at fc.weight (Linear): ")
    assert "the change the update made to the weight, step 1" in line
    # the weights themselves barely move: measured on the weight, not its change, the plant would hide
    assert bad.max_abs_err < 1e-5


def _command(data: Path, *extra: str) -> list[str]:
    """``vtools parity --train`` on the quick-start recipe, npu against cpu."""
    config = str(REPO / "configs/fashion_mnist_cpu.yaml")
    return ["--train", "-c", config, "--data-dir", str(data), "--model", "test_resnet", "--device", "npu", *extra]


@pytest.mark.cpu_only(reason=BOTH)
def test_the_command_says_the_forced_choices_and_names_the_planted_weight(
    fashion4: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    from vtools.cli.runner import command_main

    parity = command_main("parity")

    table = tmp_path / "parity.csv"
    assert parity(_command(fashion4, "--against", "cpu", "--steps", str(STEPS))) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("parity: train.py's step, test_resnet (adamw, batch 64) on npu:0 (float32) against cpu")
    assert "forced equal on both sides: channels-last off, fused optimizer step off" in lines[0]
    assert lines[-1].startswith("parity: pass (")  # ": identical)" alone; see the test above
    _plant_weight_decay(monkeypatch, 0.0)
    with pytest.raises(RunFailed, match="npu:0 differs from cpu beyond tolerance"):
        parity(_command(fashion4, "--steps", str(STEPS), "--results-file", str(table)))
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1].startswith("parity: FAIL at fc.weight (Linear): max rel err ")
    assert "> tol 0.001 (the change the update made to the weight, step 1; max abs err " in lines[-1]
    rows = pd.read_csv(table)
    first_bad = rows[~rows.ok].iloc[0]
    assert (first_bad.step, first_bad.phase, first_bad.layer) == (1, "update", "fc.weight")
    assert (rows.device == "npu:0").all() and (rows.against == "cpu").all()


@pytest.mark.cpu_only(reason="refusals: they stop before any device work")
@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--steps", "0"], "--steps must be 1 or more, got 0"),
        (["--grad-tol", "-1"], "--grad-tol must be 0 or more, got -1.0"),
        (["--model-dtype", "bfloat16"], "--model-dtype: parity --train compares eager steps from the start"),
    ],
)
def test_bad_train_mode_input_is_one_line(fashion4: Path, extra: list[str], words: str) -> None:
    from vtools.cli.runner import command_main

    parity = command_main("parity")

    with pytest.raises(UsageError, match=re.escape(words)):
        parity(_command(fashion4, *extra))
