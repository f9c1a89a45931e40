"""One code path, proven: train.py takes the same steps on the cpu and on the emulated npu.

The emulator runs the cpu's kernels, so two runs with the same seed and the same choices must end with the
same bits. Two defaults are the devices' own and are forced equal here, as a user comparing devices would:
the layout (channels-last is the cpu's default, not the npu's) and the optimizer's implementation (torch's
fused step is the cpu's default; its scalar tail rounds the momentum update once, by FMA, where the
per-tensor step rounds twice: 1 ulp of the momentum of a tensor whose size is not a multiple of 8, e.g. a
10-class head's bias, enough to part the runs after about 20 updates). Random erasing draws its noise from
each device's own generator (the npu's is seeded apart from the cpu's, as a GPU's is), so it stays off.
Everything else runs as train.py builds it: timm's optimizer groups with weight decay, label smoothing,
gradient clipping, EMA, mixup, the on-device colour jitter and normalisation. A device-dependent branch
(weight decay skipped on one device, another optimizer implementation, jitter rounded differently) makes the
final weights differ and fails the test.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import (
    DEVICE_TYPES,
    ONE_THREAD,
    assert_same_weights,
    device_flags,
    run_script,
    summary,
    torchrun,
    train_args,
    weights,
)

SAME_CHOICES = ["--channels-last", "--opt-kwargs", "fused=False", "--reprob", "0", "--warmup-epochs", "0"]
RECIPES = {
    "sgd-ema-clip-jitter": [
        "--opt",
        "sgd",
        "--lr",
        "0.05",
        "--model-ema",
        "--model-ema-decay",
        "0.9",
        "--clip-grad",
        "1",
    ]
    + ["--color-jitter", "0.4"],
    "adamw-mixup": [
        "--opt",
        "adamw",
        "--lr",
        "0.003",
        "--weight-decay",
        "0.05",
        "--mixup",
        "0.3",
        "--smoothing",
        "0.1",
    ],
}


def train_on(device_type: str, recipe: list[str], data: Path, out: Path, *extra: str) -> Path:
    name = f"{device_type}-run"
    args = train_args(data, out, name, *device_flags(device_type), *SAME_CHOICES, *recipe)
    ran = run_script([*args, "--epochs", "2", "--batch-size", "16", "--seed", "3", *extra], env=ONE_THREAD)
    assert ran.returncode == 0, ran.stderr[-3000:]
    return out / name


@pytest.mark.cpu_only(reason="compares the cpu with the emulated npu itself: both devices in one test")
@pytest.mark.parametrize("recipe", list(RECIPES))
def test_cpu_and_npu_take_the_same_steps(recipe: str, fashion4: Path, tmp_path: Path) -> None:
    """fashion4 (240 images), 2 epochs of 15 updates: every epoch's losses and top-1 and the final weights
    (and EMA) are the same bits on both devices."""
    cpu = train_on("cpu", RECIPES[recipe], fashion4, tmp_path / "cpu")
    npu = train_on("npu", RECIPES[recipe], fashion4, tmp_path / "npu")
    keys = ("train_loss", "eval_loss", "eval_top1", "eval_top5")
    assert [{k: row[k] for k in keys} for row in summary(cpu)] == [{k: row[k] for k in keys} for row in summary(npu)]
    for key in ("state_dict", *(["state_dict_ema"] if "--model-ema" in RECIPES[recipe] else [])):
        assert_same_weights(weights(cpu / "last.pth.tar", key), weights(npu / "last.pth.tar", key))


@pytest.mark.slow
@pytest.mark.cpu_only(reason="compares the cpu with the emulated npu itself: both devices in one test")
def test_two_ranks_take_the_same_steps_on_both_devices(fashion4: Path, tmp_path: Path) -> None:
    """The same under torchrun: 2 ranks each (gloo on the cpu, the emulator's collectives on the npu)."""
    finals = []
    for device_type in ("cpu", "npu"):
        args = train_args(fashion4, tmp_path, device_type, *device_flags(device_type), *SAME_CHOICES)
        args += [*RECIPES["adamw-mixup"], "--epochs", "1", "--batch-size", "8", "--seed", "3"]
        ran = run_script(torchrun(args), env=ONE_THREAD, timeout=600)
        assert ran.returncode == 0, ran.stderr[-3000:]
        finals.append(tmp_path / device_type)
    assert summary(finals[0])[0]["train_loss"] == summary(finals[1])[0]["train_loss"]
    assert_same_weights(weights(finals[0] / "last.pth.tar"), weights(finals[1] / "last.pth.tar"))


@pytest.mark.parametrize("device_type", DEVICE_TYPES)
def test_the_start_line_says_what_the_device_chose(device_type: str, fashion4: Path, tmp_path: Path) -> None:
    """Left to the device, the layout and the optimizer step are said; chosen by the flags, nothing is."""
    expected = {
        "cpu": "cpu defaults: channels-last layout and fused optimizer step; another device may choose otherwise",
        "npu": "npu defaults: channels-first layout and per-tensor optimizer step; another device may choose otherwise",
    }
    args = train_args(fashion4, tmp_path, None, *device_flags(device_type), "--epochs", "1", "--opt", "sgd")
    left = run_script(args)
    assert left.returncode == 0, left.stderr[-3000:]
    kind = device_type.split(":")[0]
    assert expected.get(kind, f"{kind} defaults: ") in left.stdout
    chosen = run_script([*args, *SAME_CHOICES])
    assert chosen.returncode == 0, chosen.stderr[-3000:]
    assert " defaults: " not in chosen.stdout
