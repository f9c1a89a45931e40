"""The evaluation assembly (vtools/evaluation/assembly.py): the model and loader validate.py and inference.py share."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.conftest import acting_dests
from vtools.cli.infer_flags import build_parser as build_inference_parser
from vtools.data.datasets import FileSamples
from vtools.data.readers.registry import Source, SourceRequest, open_source
from vtools.evaluation.assembly import EvalModel, EvalOptions
from vtools.evaluation.model_flags import ReadyOptions
from vtools.options.declare import option_names
from vtools.runtime.amp import resolve_amp
from vtools.runtime.cpu_budget import plan
from vtools.runtime.options import RuntimeOptions
from vtools.runtime.resolve import Runtime


def _options(**changes: object) -> EvalOptions:
    values = dict(
        num_classes=None,
        in_chans=None,
        model_kwargs={},
        use_ema=False,
        pretrained=False,
        img_size=64,
        input_size=None,
        crop_pct=None,
        crop_mode=None,
        mean=None,
        std=None,
        interpolation=None,
        use_test_size=True,
        reparam=False,
        channels_last=None,
        ready=ReadyOptions(test_pool=False, torchcompile=None, torchcompile_mode=None),
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
def test_validate_and_inference_read_the_same_options() -> None:
    from vtools.cli.infer_flags import parse as parse_inference
    from vtools.cli.validate_flags import parse as parse_validate
    from vtools.commands.infer import inference_options
    from vtools.commands.validate import validation_options

    common = [
        "data",
        "--model",
        "m",
        "--test-pool",
        "-b",
        "8",
        "--on-bad-image",
        "skip",
        "--input-size",
        "1",
        "32",
        "32",
    ]
    inference = inference_options(parse_inference(common + ["--gp", "max"]))  # no --reparam or border crop there
    assert (inference.reparam, inference.crop_border_pixels, inference.use_test_size) == (False, None, False)
    assert (inference.ready.test_pool, inference.batch_size, inference.on_bad_image) == (True, 8, "skip")
    assert inference.in_chans == 1 and inference.model_kwargs == {"global_pool": "max"}  # resolved as timm's
    validate = validation_options(parse_validate(common + ["--reparam", "--crop-border-pixels", "2"]))
    assert (validate.evaluation.reparam, validate.evaluation.crop_border_pixels) == (True, 2)
    assert validate.evaluation.use_test_size and validate.root == "data" and validate.model == "m"
    assert validate.evaluation.preprocess["input_size"] == [1, 32, 32]
    assert not validation_options(parse_validate(common + ["--use-train-size"])).evaluation.use_test_size


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


# inference.py's flags its command reads itself and hands to the library as other arguments, or not at all
INFERENCE_EDGE_ONLY = {
    "data": "SOURCE: the command reads its images (folder_images) or passes it as the root",
    "data_dir": "SOURCE's timm spelling",
    "model": "passed to EvalModel.load by name",
    "checkpoint": "passed to EvalModel.load",
    "gp": "merged into model_kwargs as timm passes it (resolved_model_flags)",
    "split": "the source's split, passed to SourceRequest.for_split",
    "class_map": "the command selects SOURCE's class folders with it",
    "topk": "passed to predict",
    "output_type": "passed to predict",
    "label_type": "passed to label_lookup",
    "profile": "the command wraps the loader in its step profiler",
    "log_freq": "accepted as timm's inference.py accepts it; inference.py logs no per-batch lines",
    "no_console_results": "the command prints the table",
    "results_dir": "the command writes the rows",
    "results_file": "the command writes the rows",
    "results_format": "the command writes the rows",
    **dict.fromkeys(
        ("filename_col", "fullname", "include_index", "index_col", "label_col", "output_col", "exclude_output"),
        "a column of the rows the command writes",
    ),
    "results_separate_col": "a column of the rows the command writes",
    "threshold": "a multi-label model's classes chosen from predict's scores (above_threshold)",
}
INFERENCE_RESOLVED = {"use_test_size", "reparam", "crop_border_pixels"}  # inference.py has no such flags


def inference_missing_and_extra(fields: set[str]) -> tuple[set[str], set[str]]:
    """inference.py's flags neither a field nor read at the edge; fields no flag (or resolved value) fills."""
    dests = acting_dests(build_inference_parser())
    return dests - fields - set(INFERENCE_EDGE_ONLY), fields - dests - INFERENCE_RESOLVED


# the data flags SourceRequest.for_split reads of SourceFlags (the others are the command's: SOURCE, its split)
SOURCE_READ = {"dataset", "dataset_download", "input_key", "target_key"}


def inference_fields() -> set[str]:
    """What inference.py's library calls read: the model and loader's options, the data's and the runtime's."""
    return option_names(EvalOptions) | SOURCE_READ | option_names(RuntimeOptions)


@pytest.mark.cpu_only(reason="compares dataclasses with the parser")
def test_every_inference_flag_is_a_field_or_read_at_the_edge() -> None:
    missing, extra = inference_missing_and_extra(inference_fields())
    assert not missing, f"inference.py flags no option holds and the command does not read: {sorted(missing)}"
    assert not extra, f"EvalOptions fields that are no inference.py flag: {sorted(extra)}"
    assert not set(INFERENCE_EDGE_ONLY) & inference_fields(), "a flag is either the library's or the edge's"
    planted = inference_fields() - {"input_img_mode"}
    assert inference_missing_and_extra(planted) == ({"input_img_mode"}, set())
    assert inference_missing_and_extra(inference_fields() | {"planted"}) == (set(), {"planted"})
