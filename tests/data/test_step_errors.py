"""An exception inside a loader worker (a reader, a decoder, a transform) is one bad sample: one line naming
the image, the step that failed and where in the run, or a counted skip (--on-bad-image), with workers and
with --workers 0; never torch's wrapped traceback, never a hang.

The failing transform is planted two ways: a real one a user can reach (validate.py's --crop-border-pixels
trims a tiny image to nothing, and torchvision's Resize divides by zero), and a test-only one spliced into a
script's pipeline in its own process (:func:`planted_run`, for train.py and inference.py). Runs that end in
one line are rows of tests/scripts/test_one_line_errors.py (block "worker errors"); here are the skips that go on,
and the in-process checks of the pieces.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from tests.conftest import DEVICE_TYPES, device_flags, run_script, train_args, write_image_set

TINY = (16, 16)  # the planted transform fails on images of this size, and only on them


class Planted:
    """A transform that raises on 16x16 images and passes every other image to the transform it wraps."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __call__(self, image: Image.Image) -> Any:
        if image.size == TINY:
            raise ValueError("planted failure")
        return self.inner(image)


def planted_run(command: str) -> None:
    """Run ``vtools <command>`` on ``sys.argv[1:]`` with :class:`Planted` around every dataset's transform
    (a row runs ``python -c "from tests.data.test_step_errors import planted_run; planted_run('train')" ...``)."""
    from vtools.cli.runner import run_command
    from vtools.data import datasets

    plain_init = datasets.DecodedImages.__init__

    def init(self: Any, samples: Any, transform: Any, mode: str, keep_bytes: int = 0) -> None:
        plain_init(self, samples, Planted(transform), mode, keep_bytes)

    datasets.DecodedImages.__init__ = init  # loader workers are forked: they inherit it
    run_command(command, sys.argv[1:])


def planted(command: str) -> list[str]:
    """The start of a command line (after ``python``) running ``command`` with the planted transform."""
    return ["-c", f"from tests.data.test_step_errors import planted_run; planted_run('{command}')"]


def tiny_image(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", TINY, (200, 40, 40)).save(path)
    return path


# ---------------------------------------------------------------- in process: the pieces


def test_the_failing_step_is_named_down_to_randaugments_op() -> None:
    from timm.data.auto_augment import rand_augment_transform
    from torchvision.transforms import Compose

    from vtools.data.step_errors import bad_sample_from

    augment = rand_augment_transform("rand-m9-n15-mstd0", {})
    for op in augment.ops:
        op.prob = 1.0  # every op applies: the first one a two-band image breaks is named
    with pytest.raises(Exception) as caught:
        Compose([augment])(Image.new("LA", (8, 8)))
    bad = bad_sample_from(caught.value, "x.png")
    assert bad.step.startswith("transform RandAugment op "), bad
    assert bad.path == "x.png" and bad.reason.startswith(type(caught.value).__name__)


def _planted_dataset(root: Path) -> tuple[Any, dict[str, Any], Path]:
    from timm.data import resolve_data_config

    from vtools.data.datasets import DecodedImages, FileSamples
    from vtools.data.transforms import eval_transform

    write_image_set(root, ["cat", "dog"], per_class=3)
    bad = tiny_image(root / "dog" / "tiny.png")
    paths = sorted(p for p in root.rglob("*") if p.suffix in (".jpg", ".png"))
    config = resolve_data_config({"input_size": (3, 32, 32)})
    return DecodedImages(FileSamples(paths), Planted(eval_transform(config)), "RGB"), config, bad


@pytest.mark.parametrize("workers", [0, 1])
def test_a_transform_raising_in_a_worker_is_one_line_naming_image_and_step(
    device: torch.device, workers: int, tmp_path: Path
) -> None:
    from vtools.data.decode import bad_image_handler
    from vtools.data.loaders import eval_device_loader
    from vtools.errors import UsageError

    dataset, config, bad = _planted_dataset(tmp_path)
    loader = eval_device_loader(dataset, 3, device, workers, config, False, bad_image_handler("error", []))
    with pytest.raises(UsageError) as refused:
        list(loader)
    message = str(refused.value)
    assert message.startswith(f"cannot transform image {bad}: transform Planted failed (ValueError: planted failure)")
    assert "at batch 2" in message and "--on-bad-image skip" in message and "\n" not in message


@pytest.mark.parametrize("workers", [0, 1])
def test_a_transform_raising_in_a_worker_is_skipped_and_counted(
    device: torch.device, workers: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from vtools.data.decode import bad_image_handler
    from vtools.data.loaders import eval_device_loader

    dataset, config, bad = _planted_dataset(tmp_path)
    skipped: list[str] = []
    loader = eval_device_loader(dataset, 3, device, workers, config, False, bad_image_handler("skip", skipped))
    assert sum(len(batch.targets) for batch in loader) == len(dataset) - 1
    assert skipped == [str(bad)]
    assert f"warning: skipped image {bad}: transform Planted failed" in capsys.readouterr().err


def test_a_training_sample_that_fails_says_its_epoch(tmp_path: Path) -> None:
    from vtools.data.decode import BadSample
    from vtools.data.sampling import SeededSamples

    dataset, _, bad = _planted_dataset(tmp_path)
    index = dataset.samples.paths.index(str(bad))
    failed = SeededSamples(dataset, seed=0)[(3, index)][0]
    assert isinstance(failed, BadSample) and failed.where == "epoch 3" and failed.step == "transform Planted"


def uncropped(image: Image.Image) -> torch.Tensor:
    return torch.as_tensor(np.asarray(image))


@pytest.mark.cpu_only(reason="a worker's failure outside any sample is host-side")
def test_a_worker_failure_outside_any_sample_is_one_line(tmp_path: Path) -> None:
    """Items that do not stack (a transform without a crop) fail in the worker's collate, outside any
    one sample: one line, exit 3, instead of torch's wrapped traceback."""
    from vtools.data.datasets import DecodedImages, FileSamples
    from vtools.data.loaders import DeviceLoader, make_loader
    from vtools.errors import RunFailed

    write_image_set(tmp_path, ["cat"], per_class=4)  # sizes differ
    dataset = DecodedImages(FileSamples(sorted(tmp_path.rglob("*.*"))), uncropped, "RGB")
    device = torch.device("cpu")
    loader = DeviceLoader(make_loader(dataset, 4, device, 1, persistent=False), device, [0.5] * 3, [0.5] * 3)
    with pytest.raises(RunFailed) as failed:
        list(loader)
    assert str(failed.value).startswith("a data-loader worker failed: RuntimeError: stack expects")
    assert "Traceback" not in str(failed.value)


# ---------------------------------------------------------------- scripts, as a user runs them: skip goes on


@pytest.mark.parametrize("device_type", DEVICE_TYPES)
def test_validate_skips_the_image_a_real_transform_fails_on(
    device_type: str, custom_images: Path, custom_model_dir: Path, tmp_path: Path
) -> None:
    """--crop-border-pixels 10 trims a 16x16 image to nothing, and Resize divides by zero on it."""
    root = tmp_path / "imgs"
    shutil.copytree(custom_images, root)
    bad = tiny_image(root / "dog" / "tiny.png")
    args = ["validate.py", str(root), "--model", str(custom_model_dir), *device_flags(device_type)]
    proc = run_script([*args, "--crop-border-pixels", "10", "--on-bad-image", "skip", "--workers", "1"])
    assert proc.returncode == 0, proc.stderr
    assert [line for line in proc.stderr.splitlines() if line.strip()] == [
        f"warning: skipped image {bad}: transform Resize failed (ZeroDivisionError: division by zero) at batch 0"
    ]
    assert "on 12 images (13 found, 1 unreadable skipped)" in proc.stdout


@pytest.mark.parametrize("device_type", DEVICE_TYPES)
@pytest.mark.parametrize("workers", ["0", "1"])
def test_training_replaces_the_image_a_transform_fails_on(
    device_type: str, workers: str, fashion4: Path, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    shutil.copytree(fashion4, data)
    bad = tiny_image(data / "train" / "bag" / "tiny.png")
    args = train_args(data, tmp_path, "run", *device_flags(device_type), "--epochs", "1", "--workers", workers)
    proc = run_script([*planted("train"), *args[1:], "--on-bad-image", "skip"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1, proc.stderr
    assert warnings[0].startswith(f"warning: skipped image {bad}: transform Planted failed (ValueError: planted")
    assert "at training epoch 0, batch " in warnings[0] and "another image in its place" in warnings[0]
    assert (tmp_path / "run" / "model").is_dir()


@pytest.mark.parametrize("device_type", DEVICE_TYPES)
def test_inference_skips_the_image_a_transform_fails_on(
    device_type: str, custom_images: Path, custom_model_dir: Path, tmp_path: Path
) -> None:
    root = tmp_path / "imgs"
    shutil.copytree(custom_images, root)
    bad = tiny_image(root / "tiny.png")
    proc = run_script(
        [*planted("infer"), str(root), "--model", str(custom_model_dir), *device_flags(device_type)]
        + ["--on-bad-image", "skip", "--results-dir", str(tmp_path / "out")]
    )
    assert proc.returncode == 0, proc.stderr
    assert f"warning: skipped image {bad}: transform Planted failed" in proc.stderr
    assert "12 images classified" in proc.stdout and "1 unreadable skipped" in proc.stdout
