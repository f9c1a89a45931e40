"""vtools parity: two devices, the same weights and batch, compared layer by layer (vtools/observe/parity.py)."""

from __future__ import annotations

import copy
import math

import pandas as pd
import pytest
import timm
import torch

from tests.conftest import assert_one_line_error, device_flags, run_script, write_image_set, write_model_folder
from vtools.observe import parity
from vtools.runtime.amp import AmpPolicy

CPU = torch.device("cpu")
FP32 = AmpPolicy("cpu", None)


def _model(name: str = "test_resnet") -> torch.nn.Module:
    torch.manual_seed(0)
    return timm.create_model(name)


def _batch(size: int = 2, pixels: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return torch.randn(size, 3, pixels, pixels, generator=generator), torch.tensor([1, 7])


def first_module(model: torch.nn.Module, kind: type) -> str:
    """The first module of ``kind`` in execution order (registration order, for the models used here)."""
    return next(name for name, module in model.named_modules() if isinstance(module, kind))


def test_relative_error_is_against_the_largest_reference_value() -> None:
    b = torch.tensor([100.0, 1e-6, 0.0])
    a = b + torch.tensor([0.0, 1e-6, 0.0])  # an element near zero doubles: no explosion
    max_abs, max_rel, scale = parity.tensor_error(a, b)
    assert max_abs == pytest.approx(1e-6) and max_rel == pytest.approx(1e-8) and scale == 100.0
    assert parity.tensor_error(torch.zeros(3), torch.zeros(3)) == (0.0, 0.0, 0.0)
    nan = torch.tensor([math.nan, 1.0])
    assert parity.tensor_error(nan, nan)[1] == 0.0  # the same nan on both sides
    assert parity.tensor_error(nan, torch.tensor([0.0, 1.0]))[1] == math.inf
    # a tensor that is nearly zero everywhere is measured against the floor, not its own noise
    assert parity.tensor_error(torch.tensor([2e-9]), torch.tensor([1e-9]), floor=1e-3)[1] == pytest.approx(1e-6)


@pytest.mark.cpu_only(reason="cpu against cpu: the comparison itself, which must find nothing")
def test_the_same_device_twice_passes() -> None:
    model, (images, targets) = _model(), _batch()
    reference = parity.run_side(model, images, targets, CPU, FP32, steps=2, lr=0.01)
    candidate = parity.run_side(model, images, targets, CPU, FP32, steps=2, lr=0.01)
    entries = parity.compare(reference, candidate, parity.default_tolerances("float32"))
    assert parity.first_failure(entries) is None
    assert {entry.phase for entry in entries} == set(parity.PHASES) and {entry.step for entry in entries} == {1, 2}
    assert all(entry.max_abs_err == 0 for entry in entries)
    assert parity.verdict(entries, 2).startswith("parity: pass")


@pytest.mark.cpu_only(reason="a perturbation planted in one layer on cpu; the emulated fault is tested on npu")
def test_a_perturbed_layer_is_named_not_the_layers_after_it() -> None:
    model, (images, targets) = _model(), _batch()
    reference = parity.run_side(model, images, targets, CPU, FP32, steps=1, lr=0.01)
    perturbed = copy.deepcopy(model)
    layer = "layer2.0.conv1"

    def noise(module: torch.nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
        generator = torch.Generator().manual_seed(1)
        return output + 1e-3 * output.abs().max() * torch.randn(output.shape, generator=generator)

    perturbed.get_submodule(layer).register_forward_hook(noise)
    candidate = parity.run_side(perturbed, images, targets, CPU, FP32, steps=1, lr=0.01)
    entries = parity.compare(reference, candidate, parity.default_tolerances("float32"))
    bad = [entry for entry in entries if not entry.ok]
    assert len(bad) > 5  # the error travels on through every later layer...
    first = parity.first_failure(entries)
    assert (first.layer, first.module_type, first.phase) == (layer, "Conv2d", "forward")  # ...the first is named
    assert 5e-4 < first.max_rel_err < 1e-2
    line = parity.verdict(entries, 1)
    assert line.startswith(f"parity: FAIL at {layer} (Conv2d): max rel err ") and "> tol 0.0001" in line


@pytest.mark.npu_only(reason="the numeric fault is an emulated-npu feature (tests/emulated_npu/faults.py)")
def test_a_faulty_npu_operator_is_found_in_the_first_layer_that_uses_it() -> None:
    from tests.emulated_npu import faults

    model, (images, targets) = _model(), _batch()
    npu = torch.device("npu:0")
    reference = parity.run_side(model, images, targets, CPU, FP32, steps=1, lr=0.01)
    clean = parity.run_side(model, images, targets, npu, AmpPolicy("npu", None), steps=1, lr=0.01)
    tols = parity.default_tolerances("float32")
    assert parity.first_failure(parity.compare(reference, clean, tols)) is None
    with faults.faulty("aten::convolution"):
        faulty = parity.run_side(model, images, targets, npu, AmpPolicy("npu", None), steps=1, lr=0.01)
    first = parity.first_failure(parity.compare(reference, faulty, tols))
    assert first.layer == first_module(model, torch.nn.Conv2d) == "conv1.0"
    assert first.max_rel_err == pytest.approx(1e-2, rel=1e-3)


def _parity(*args: str, env: dict[str, str] | None = None):
    return run_script(["-m", "vtools", "parity", *args], env=env)


@pytest.mark.npu_only(reason="the emulated npu against cpu, as on an Ascend host")
def test_cli_passes_on_a_timm_name_and_writes_the_table(tmp_path) -> None:
    table = tmp_path / "parity.csv"
    proc = _parity("test_resnet", *device_flags("npu"), "--against", "cpu", "-b", "2", "--img-size", "64",
                   "--results-file", str(table))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1].startswith("parity: pass (57 activations, 47 gradients")
    rows = pd.read_csv(table)
    assert set(rows.phase) == {"forward", "loss", "backward", "update"} and rows.ok.all()
    assert rows.layer.iloc[0] == "conv1.0" and (rows.device == "npu:0").all() and (rows.against == "cpu").all()


@pytest.mark.npu_only(reason="the emulated npu against cpu, as on an Ascend host")
def test_cli_passes_on_a_model_folder_with_real_images(tmp_path) -> None:
    folder = write_model_folder(tmp_path / "model", 3, model_name="test_vit")
    images = write_image_set(tmp_path / "images", ["a", "b"], per_class=1)
    proc = _parity(str(folder), *device_flags("npu"), "--data", str(images), "--steps", "2")
    assert proc.returncode == 0, proc.stderr
    assert "2 images from" in proc.stdout and proc.stdout.strip().splitlines()[-1].startswith("parity: pass")


@pytest.mark.npu_only(reason="the numeric fault is an emulated-npu feature (tests/emulated_npu/faults.py)")
@pytest.mark.parametrize(
    ("model_name", "op", "kind", "expected"),
    [("test_resnet", "aten::convolution", torch.nn.Conv2d, "conv1.0"), ("test_vit", "aten::addmm", torch.nn.Linear,
     "blocks.0.attn.qkv")],
)  # fmt: skip
def test_cli_names_the_first_layer_of_a_faulty_operator(tmp_path, model_name, op, kind, expected) -> None:
    assert first_module(_model(model_name), kind) == expected
    proc = _parity(model_name, *device_flags("npu"), "-b", "2", env={"VTOOLS_EMU_NPU_FAULT_OP": op})
    verdict = proc.stdout.strip().splitlines()[-1]
    assert verdict.startswith(f"parity: FAIL at {expected} ({kind.__name__}): max rel err 0.01 > tol 0.0001"), (
        proc.stdout
    )
    assert_one_line_error(proc, 3, "npu:0 differs from cpu beyond tolerance")


@pytest.mark.cpu_only(reason="input checks: they stop before any device work")
def test_bad_input_is_one_line(tmp_path) -> None:
    proc = _parity("test_resnet", "--device", "cpu", "--data", str(tmp_path / "missing"))
    assert_one_line_error(proc, 2, "missing")
    from vtools.cli.runner import command_main  # the rest in process: the same one-line UsageError

    parity = command_main("parity")
    from vtools.errors import UsageError

    with pytest.raises(UsageError, match="give the model"):
        parity(["--device", "cpu"])
    with pytest.raises(UsageError, match="--steps must be 1 or more"):
        parity(["test_resnet", "--steps", "0"])


def _overflowing_linear() -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    """Two linear layers and inputs of 100: the first layer's float16 gradient passes 65504 at a loss scale of
    2**16 (not at 2**14), and its float16 output passes it when its weights are 1000x larger."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Linear(8, 3))
    generator = torch.Generator().manual_seed(1)
    return model, torch.randn(4, 6, generator=generator) * 100, torch.randint(0, 3, (4,), generator=generator)


def test_float16_gradients_are_compared_at_a_loss_scale_that_does_not_overflow(chip_device: torch.device) -> None:
    """The device side scales its float16 loss down until no gradient overflows: on a 910A the gradients hold
    65504 rather than inf, and only the float-status flag tells the scale was too large (kept, it would
    report every gradient wrong)."""
    from vtools.runtime.amp import resolve_amp

    model, images, targets = _overflowing_linear()
    reference = parity.run_side(model, images, targets, CPU, FP32, steps=1, lr=0.01)
    amp = resolve_amp(chip_device, True, "float16")
    candidate = parity.run_side(model, images, targets, chip_device, amp, steps=1, lr=0.01)
    entries = parity.compare(reference, candidate, parity.default_tolerances("float16"))
    assert [entry for entry in entries if entry.phase in ("backward", "update") and not entry.ok] == []


def test_a_layer_whose_float16_output_overflows_is_named_as_an_inf_would_be(chip_device: torch.device) -> None:
    """On every chip the first failure is layer 0's activation with an infinite error: an inf on an IEEE chip,
    the raised flag on a 910A (whose 65504 would otherwise compare as merely 40 % off)."""
    from vtools.runtime.amp import resolve_amp

    model, images, targets = _overflowing_linear()
    with torch.no_grad():
        model[0].weight.mul_(1000)
    reference = parity.run_side(model, images, targets, CPU, FP32, steps=1, lr=0.01)
    amp = resolve_amp(chip_device, True, "float16")
    candidate = parity.run_side(model, images, targets, chip_device, amp, steps=1, lr=0.01)
    bad = parity.first_failure(parity.compare(reference, candidate, parity.default_tolerances("float16")))
    assert (bad.phase, bad.layer, bad.max_rel_err) == ("forward", "0", math.inf)
