"""benchmarks/options.py: the bench's flags as its measurements take them."""

from __future__ import annotations

import dataclasses

import pytest

from benchmarks.command import build_parser
from benchmarks.options import BenchOptions, train_job
from tests.conftest import REPO, acting_dests
from vtools.cli.typed import typed_options
from vtools.options.declare import option_names

pytestmark = pytest.mark.cpu_only(reason="compares dataclasses with the parser; runs nothing on a device")

# the bench's flags its command reads itself
EDGE_ONLY = {
    "output": "the command writes the table",
    "one": "the child process's measurement, picked by the command",
    "photos": "the command makes the photo set and passes it as --data",
    "recipe_precisions": "the command runs one measure_recipe per precision",
}


def missing_and_extra(fields: set[str]) -> tuple[set[str], set[str]]:
    dests = acting_dests(build_parser())
    return dests - fields - set(EDGE_ONLY), fields - dests


def test_every_bench_flag_is_a_field_or_read_at_the_edge() -> None:
    assert missing_and_extra(option_names(BenchOptions)) == (set(), set())
    assert not set(EDGE_ONLY) & option_names(BenchOptions)


def test_a_missing_field_is_caught() -> None:
    assert missing_and_extra(option_names(BenchOptions) - {"warmup"}) == ({"warmup"}, set())
    assert missing_and_extra(option_names(BenchOptions) | {"planted"}) == (set(), {"planted"})


def test_the_options_are_frozen_and_declare_no_defaults() -> None:
    options = typed_options(BenchOptions, build_parser().parse_args(["--steps", "2"]))
    assert options.steps == 2 and options.stores == ""
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.steps = 3  # type: ignore[misc]
    assert [f.name for f in dataclasses.fields(BenchOptions) if f.default is not dataclasses.MISSING] == []


def test_the_train_job_reads_dir_as_the_data_folder() -> None:
    """The bench's train.py command lines give the folder as DIR: the job reads it as --data-dir, as train.py."""
    data = str(REPO / "data/fashion-mnist-mini")
    job = train_job([data, "--model", "test_resnet", "--batch-size", "4"])
    assert job.data.data_dir == data and job.data.batch_size == 4 and job.model.model == "test_resnet"
