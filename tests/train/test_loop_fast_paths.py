"""The speed-ups of the training loop change no result: checkpoints written in the background hold the
state of the moment they were asked for, fused optimizer steps follow timm's optimizers, and batches
decoded ahead of an epoch are that epoch's."""

from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest
import timm
import torch
from timm.optim import create_optimizer_v2

from tests.conftest import REPO, run_script
from vtools.cli.train_flags import build_parser
from vtools.cli.typed import typed_options
from vtools.data.datasets import ImageFiles
from vtools.data.loaders import DeviceLoader, make_loader
from vtools.data.sampling import EpochSampler, SeededSamples
from vtools.options.train_job import TrainJob
from vtools.runtime.device import fused_optimizer
from vtools.train.checkpoint import BEST, LAST, CheckpointManager
from vtools.train.recipe import build_optimizer, fused_kernel, load_optimizer_state


def test_background_checkpoint_holds_the_state_at_save_time(device: torch.device, tmp_path: Path) -> None:
    model = torch.nn.Linear(4, 3).to(device)
    expected = {name: value.detach().cpu().clone() for name, value in model.state_dict().items()}
    manager = CheckpointManager(tmp_path, keep=2)
    assert manager.save({"state_dict": model.state_dict(), "epoch": 1}, epoch=0, metric=50.0)
    with torch.no_grad():  # training goes on while the file is written
        for param in model.parameters():
            param.add_(1.0)
    manager.wait()
    saved = torch.load(tmp_path / LAST, map_location="cpu", weights_only=True)
    for name, value in expected.items():
        assert torch.equal(saved["state_dict"][name], value), name
    assert saved["best_metric"] == 50.0 and saved["best_epoch"] == 0
    for copy_name in (BEST, "checkpoint-0.pth.tar"):  # copies, not links: damage to last spares them
        assert (tmp_path / copy_name).read_bytes() == (tmp_path / LAST).read_bytes()
        assert not os.path.samefile(tmp_path / copy_name, tmp_path / LAST)


@pytest.mark.parametrize("opt", ["sgd", "adamw", "lamb"])
def test_optimizer_steps_follow_timms_optimizer(device: torch.device, opt: str) -> None:
    """vtools' optimizer (fused where torch has a fused step for the optimizer and the device) against
    timm's create_optimizer_v2 with the same flags: given the same gradients, the same weights after each
    step (fed the same gradients: through the network, Adam's normalization would magnify rounding)."""
    torch.manual_seed(0)
    ours_model = timm.create_model("test_resnet", num_classes=5).to(device)
    timm_model = copy.deepcopy(ours_model)
    args = build_parser().parse_args(["--opt", opt, "--weight-decay", "0.05", "--momentum", "0.9"])
    ours = build_optimizer(ours_model, typed_options(TrainJob, args).optim, lr=0.01)
    reference = create_optimizer_v2(timm_model, opt, lr=0.01, weight_decay=0.05, momentum=0.9)
    kernel = fused_kernel(opt)
    assert bool(ours.param_groups[0].get("fused")) == (kernel is not None and fused_optimizer(device, kernel))
    assert (kernel is None) == (opt == "lamb")
    images = torch.randn(4, 3, 32, 32, device=device)
    targets = torch.tensor([0, 1, 2, 3], device=device)
    for _ in range(3):
        torch.nn.functional.cross_entropy(ours_model(images), targets).backward()
        for a, b in zip(ours_model.parameters(), timm_model.parameters()):
            b.grad = a.grad.clone()
        for optimizer in (ours, reference):
            optimizer.step()
            optimizer.zero_grad()
        for (name, a), b in zip(ours_model.named_parameters(), timm_model.parameters()):
            torch.testing.assert_close(a.detach().cpu(), b.detach().cpu(), rtol=1e-5, atol=1e-6, msg=name)


def test_a_started_pass_is_the_epoch_it_was_started_for(device: torch.device) -> None:
    """DeviceLoader.start() (the next epoch decoded during validation) yields that epoch's batches, even
    if the sampler moves on before the pass is consumed."""
    images = sorted((REPO / "data/fashion-mnist-mini/val/bag").glob("*.png"))[:12]

    def loader(sampler: EpochSampler) -> DeviceLoader:
        source = SeededSamples(ImageFiles(images, None, tiny_tensor, "RGB"), seed=1)
        return DeviceLoader(
            make_loader(source, 4, device, workers=1, sampler=sampler, drop_last=True), device, (0.5,) * 3, (0.5,) * 3
        )

    def order(sampler: EpochSampler, early: bool) -> list[int]:
        batches = loader(sampler)
        sampler.set_epoch(3)
        if early:
            batches.start()
            sampler.set_epoch(4)
        return [int(i) for batch in batches for i in batch.indices]

    assert order(EpochSampler(12, seed=1), early=True) == order(EpochSampler(12, seed=1), early=False)


def tiny_tensor(image: object) -> torch.Tensor:
    """A stand-in transform (picklable, for the worker): the order of the samples is what is compared."""
    return torch.zeros(3, 2, 2, dtype=torch.uint8)


@pytest.mark.parametrize("jitter", [0.0, 0.4])
def test_train_transform_is_timms(jitter: float) -> None:
    """build_train_transform against timm's create_transform for the same flags (a zero jitter is left out
    of ours, which must change nothing): the same uint8 tensors for the same seeds."""
    import random

    from PIL import Image
    from timm.data import create_transform

    from vtools.train.recipe import build_train_transform

    args = build_parser().parse_args(["--color-jitter", str(jitter), "--scale", "0.5", "1.0", "--hflip", "0.5"])
    config = {"input_size": (3, 24, 24), "mean": (0.5,) * 3, "std": (0.5,) * 3}
    ours = build_train_transform(typed_options(TrainJob, args).augment, config)
    theirs = create_transform(
        (3, 24, 24),
        is_training=True,
        use_prefetcher=True,
        scale=(0.5, 1.0),
        hflip=0.5,
        color_jitter=jitter,
        interpolation="random",
        mean=(0.5,) * 3,
        std=(0.5,) * 3,
    )
    path = sorted((REPO / "data/fashion-mnist-mini/train/sneaker").glob("*.png"))[0]
    image = Image.open(path).convert("RGB")
    for seed in range(8):
        outputs = []
        for transform in (ours, theirs):
            random.seed(seed)
            torch.manual_seed(seed)
            outputs.append(transform(image))
        assert torch.equal(outputs[0], outputs[1]), seed


def test_a_checkpoint_resumes_on_a_device_without_fused_steps(device: torch.device) -> None:
    """A checkpoint from cpu (fused steps) loaded into this device's optimizer keeps this run's
    implementation flags, so the step runs where fused kernels do not exist (the emulated npu)."""
    args = build_parser().parse_args(["--opt", "sgd"])
    torch.manual_seed(0)
    saved_on_cpu = build_optimizer(torch.nn.Linear(4, 3), typed_options(TrainJob, args).optim, lr=0.1)
    assert saved_on_cpu.param_groups[0]["fused"]
    model = torch.nn.Linear(4, 3).to(device)
    optimizer = build_optimizer(model, typed_options(TrainJob, args).optim, lr=0.1)
    flags = [group.get("fused") for group in optimizer.param_groups]
    load_optimizer_state(optimizer, saved_on_cpu.state_dict())
    assert [group.get("fused") for group in optimizer.param_groups] == flags
    model(torch.ones(2, 4, device=device)).sum().backward()
    optimizer.step()


@pytest.mark.cpu_only(reason="process exit is host-side: no tensor is involved")
@pytest.mark.parametrize("ending", ["run_cli(lambda argv: 0)", "pass"])
def test_a_finished_run_skips_teardown_but_keeps_exit_guarantees(tmp_path: Path, ending: str) -> None:
    """run_cli ends the process without the interpreter's teardown, yet exit handlers run, non-daemon
    threads finish, output is flushed; with it or with a plain end of the program, loader workers still
    alive at exit are stopped without torch reporting them as failed workers."""
    script = f"""
import atexit, threading, time
import torch
from vtools.cli.runner import run_cli
atexit.register(lambda: print("exit handler ran"))
def late_write():
    time.sleep(0.3)
    open({str(tmp_path / "late.txt")!r}, "w").write("done")
threading.Thread(target=late_write).start()
from vtools.data.loaders import make_loader
samples = [(torch.zeros(2, dtype=torch.uint8), 0, i) for i in range(64)]
live = iter(make_loader(samples, 4, torch.device("cpu"), workers=1))
next(live)
print("results", end="")
{ending}
"""
    proc = run_script(["-c", script])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("results") and "exit handler ran" in proc.stdout
    assert (tmp_path / "late.txt").read_text() == "done"
    assert proc.stderr == "", proc.stderr
