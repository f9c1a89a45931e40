"""The command edge (vtools/cli/typed.py): a Namespace becomes the frozen dataclasses the library takes."""

from __future__ import annotations

import argparse
import dataclasses
import typing

import pytest

from tests.options.test_shared import REQUIRED
from vtools.cli import registry, train_flags
from vtools.cli.typed import command_options, generated_options, options_type, typed_options
from vtools.options.declare import ANNOTATION, option_names
from vtools.options.train_job import TrainJob

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


# ---------------------------------------------------------------- every command's typed options (issue 62)


@pytest.mark.parametrize("name", [found.name for found in registry.COMMANDS])
def test_each_command_runs_with_one_typed_field_per_flag(name: str) -> None:
    """A command's options have exactly its parser's flags, each typed by its declaration, holding what the
    parse gave, and nothing below the command line can change them."""
    parser = registry.build_parser(name)
    declared = {action.dest: action for action in parser._actions if action.dest != "help"}
    cls = options_type(name)
    hints = typing.get_type_hints(cls)
    assert set(hints) == set(declared)
    assert all(hints[dest] == getattr(action, ANNOTATION) for dest, action in declared.items())
    required = {**REQUIRED, "bulk": ["validate.py", "--model", "m"], "parity": ["resnet18"]}
    parsed = parser.parse_args(required.get(name, []))  # every command parses here: none is skipped
    options = generated_options(name, parsed)
    assert options.values() == vars(parsed)
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.device = "planted"  # type: ignore[attr-defined]


def test_train_runs_with_the_job_that_carries_every_option() -> None:
    """train.py's job holds every value its parse gave (config.yaml, the checkpoints and the trackers are made
    from it), and a value the flags give reaches the concern the code reads."""
    parsed = train_flags.parse(["/data", "--lr", "0.25", "--model", "resnet10t", "--pin-mem"])
    job = command_options("train", parsed)
    assert isinstance(job, TrainJob)
    assert job.values() == vars(parsed)
    assert (job.optim.lr, job.model.model, job.timm.pin_mem) == (0.25, "resnet10t", True)


def test_a_missing_flag_in_the_generated_type_is_seen() -> None:
    """Planted: a parse lacking one of the command's flags keeps the declared default, so the field list is
    the parser's, not the parse's."""
    parsed = argparse.Namespace(device="cpu")  # env's other flags absent
    options = generated_options("env", parsed)
    assert (options.device, options.check) == ("cpu", False)
