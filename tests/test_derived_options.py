"""vtools/derived_options.py: what groups of option values amount to, the same for a parsed command line and for
the typed options the library takes (both carry the flags' names)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from vtools.cli import train_flags
from vtools.derived_options import (
    interval_seconds,
    mixup_requested,
    model_in_chans,
    preprocess_overrides,
    timm_model_kwargs,
)

pytestmark = pytest.mark.cpu_only(reason="reads option values; runs nothing on a device")


@pytest.mark.parametrize(
    ("flags", "mixed"),
    [([], False), (["--mixup", "0.2"], True), (["--cutmix", "1"], True), (["--cutmix-minmax", "0.2", "0.8"], True)],
)
def test_mixed_batches_are_asked_for_by_any_of_three_flags(flags: list[str], mixed: bool) -> None:
    assert mixup_requested(train_flags.parse(["--data-dir", "d", "-b", "8", *flags])) is mixed


def test_input_channels_follow_timms_precedence() -> None:
    """--in-chans, else --input-size's first value, else the model's own (None)."""
    assert model_in_chans(SimpleNamespace(in_chans=None, input_size=None)) is None
    assert model_in_chans(SimpleNamespace(in_chans=None, input_size=[1, 224, 224])) == 1
    assert model_in_chans(SimpleNamespace(in_chans=4, input_size=[1, 224, 224])) == 4
    assert model_in_chans(SimpleNamespace()) is None  # inference.py has neither flag


def test_model_kwargs_gain_the_global_pool_flag() -> None:
    options = SimpleNamespace(model_kwargs={"drop_rate": 0.1}, gp="max")
    assert timm_model_kwargs(options) == {"drop_rate": 0.1, "global_pool": "max"}
    assert timm_model_kwargs(SimpleNamespace(model_kwargs={}, gp=None)) == {}


def test_preprocessing_overrides_name_what_timm_resolves() -> None:
    args = train_flags.parse(["--data-dir", "d", "--img-size", "64", "--crop-pct", "0.9"])
    overrides = preprocess_overrides(args)
    assert (overrides["img_size"], overrides["crop_pct"], overrides["mean"]) == (64, 0.9, None)
    timm_keys = {"img_size", "input_size", "in_chans", "crop_pct", "crop_mode", "mean", "std", "interpolation"}
    assert set(overrides) == timm_keys


@pytest.mark.parametrize(("value", "seconds"), [(500, None), ("900s", 900.0), ("30m", 1800.0), ("1.5h", 5400.0)])
def test_an_interval_is_updates_or_a_time(value: int | str, seconds: float | None) -> None:
    assert interval_seconds(value) == seconds
