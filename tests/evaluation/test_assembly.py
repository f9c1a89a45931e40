"""The evaluation assembly (vtools/evaluation/assembly.py): the model and loader validate.py and inference.py share."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from vtools.data.datasets import FileSamples
from vtools.data.readers.registry import Source, SourceRequest, open_source
from vtools.evaluation.assembly import EvalModel, EvalOptions
from vtools.runtime.amp import resolve_amp
from vtools.runtime.cpu_budget import plan
from vtools.runtime.resolve import Runtime


def _options(**changes: object) -> EvalOptions:
    values = dict(
        num_classes=None,
        in_chans=None,
        model_kwargs={},
        use_ema=False,
        pretrained=False,
        preprocess={"img_size": 64},
        use_test_size=True,
        reparam=False,
        channels_last=None,
        test_pool=False,
        torchcompile=None,
        torchcompile_mode=None,
        input_img_mode=None,
        crop_border_pixels=None,
        batch_size=5,
        on_bad_image="error",
    )
    return EvalOptions(**{**values, **changes})


def test_a_model_and_its_loader(device: torch.device, custom_images: Path, custom_model_dir: Path) -> None:
    runtime = Runtime(device, resolve_amp(device, False), plan(device.type, 1, workers=0))
    options = _options()
    model = EvalModel.load(str(custom_model_dir), "", options, runtime)  # no checkpoint: the folder's weights
    assert model.data_config["input_size"] == (3, 64, 64) and model.param_count > 0
    assert model.module is model.plain and next(model.module.parameters()).device.type == device.type
    model.ready(options, runtime)
    source = open_source(SourceRequest("", str(custom_images), "."))
    skipped: list[str] = []
    batches = list(model.loader(source, options, runtime, "validation", skipped))
    assert [len(batch.targets) for batch in batches] == [5, 5, 2] and not skipped
    images = batches[0].images
    assert images.device.type == device.type and images.shape[1:] == (3, 64, 64) and images.is_floating_point()


@pytest.mark.cpu_only(reason="the options only; the loader is covered above")
def test_validate_and_inference_read_the_same_options(custom_model_dir: Path) -> None:
    import argparse

    flags = argparse.Namespace(
        num_classes=None,
        model_kwargs={},
        use_ema=False,
        pretrained=False,
        img_size=None,
        input_size=None,
        in_chans=None,
        crop_pct=None,
        crop_mode=None,
        mean=None,
        std=None,
        interpolation=None,
        channels_last=None,
        test_pool=True,
        torchcompile=None,
        torchcompile_mode=None,
        input_img_mode=None,
        batch_size=8,
        on_bad_image="skip",
    )
    inference = EvalOptions.from_flags(flags, use_test_size=False)  # inference.py has no --reparam or border crop
    assert (inference.reparam, inference.crop_border_pixels, inference.test_pool) == (False, None, True)
    validate = EvalOptions.from_flags(argparse.Namespace(**vars(flags), reparam=True, crop_border_pixels=2), True)
    assert (validate.reparam, validate.crop_border_pixels, validate.use_test_size) == (True, 2, True)


def test_unreadable_entries_are_skipped_into_the_list(
    device: torch.device, custom_images: Path, custom_model_dir: Path, tmp_path: Path
) -> None:
    runtime = Runtime(device, resolve_amp(device, False), plan(device.type, 1, workers=0))
    options = _options(on_bad_image="skip")
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"not an image")
    good = sorted(str(p) for p in custom_images.rglob("*.png"))[:3]
    source = Source(FileSamples([*good, str(bad)]), None, str(tmp_path))
    model = EvalModel.load(str(custom_model_dir), "", options, runtime)
    model.ready(options, runtime)
    skipped: list[str] = []
    seen = sum(len(batch.targets) for batch in model.loader(source, options, runtime, "inference", skipped))
    assert seen == 3 and len(skipped) == 1 and "bad.png" in skipped[0]
