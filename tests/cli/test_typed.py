"""The command edge (vtools/cli/typed.py): a Namespace becomes the frozen dataclasses the library takes."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from vtools.cli.typed import option_names, typed_options

pytestmark = pytest.mark.cpu_only(reason="builds dataclasses; runs nothing on a device")


@dataclasses.dataclass(frozen=True)
class Schedule:
    lr: float
    epochs: int


@dataclasses.dataclass(frozen=True)
class Job:
    schedule: Schedule
    model: str
    workers: int = 4  # a command without --workers gets this


def test_fields_are_filled_by_name_and_concerns_nest() -> None:
    args = argparse.Namespace(lr=0.1, epochs=3, model="resnet18", unused="x")
    job = typed_options(Job, args)
    assert job == Job(schedule=Schedule(lr=0.1, epochs=3), model="resnet18", workers=4)
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.model = "other"  # type: ignore[misc]


def test_overrides_replace_parsed_values_and_the_namespace_is_untouched() -> None:
    args = argparse.Namespace(lr=0.1, epochs=3, model="resnet18", workers=8)
    assert typed_options(Job, args, model="vit").model == "vit"
    assert typed_options(Job, args).workers == 8
    assert args.model == "resnet18"


def test_a_missing_option_names_the_field() -> None:
    with pytest.raises(AttributeError, match=r"Schedule\.epochs"):
        typed_options(Job, argparse.Namespace(lr=0.1, model="m"))
    with pytest.raises(TypeError, match="not a dataclass"):
        typed_options(argparse.Namespace, argparse.Namespace())


def test_option_names_walk_the_concerns() -> None:
    assert option_names(Job) == {"lr", "epochs", "model", "workers"}
