"""vtools/cli/declared.py: train.py's own flags generated from their declarations, and their checks.

Adding a plain flag is one declaration plus the code that reads it: the tests below declare a concern of
their own, as a new option would be declared in vtools/options/train_job.py, and use the parser made from it.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Literal

import pytest

from tests.conftest import REPO
from vtools.cli.declared import add_declared, resume_changeable
from vtools.cli.parser import OneLineParser
from vtools.errors import UsageError
from vtools.options import values
from vtools.options.declare import FRACTION, POSITIVE, option

pytestmark = pytest.mark.cpu_only(reason="argparse generated from dataclasses; nothing runs on a device")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Planted:
    title = "planted"
    warmup: int = option("--warmup", default=5, allowed=POSITIVE, help="warmup epochs")
    floor: float | None = option("--floor", default=None, allowed=FRACTION, help="a fraction, or nothing")
    ema: bool = option("--ema", default=False, resume=True, help="a switch")
    milestones: list[int] = option("--milestones", "--ms", default=[30, 60], nargs="+", help="epochs")
    mode: str = option("--mode", default="a", choices=("a", "b"), help="a choice")
    extra: dict = option("--extra", default={}, nargs="*", action=values.KEY_VALUE_PAIRS, help="KEY=VALUE pairs")
    every: int | str = option("--every", default=0, type=values.recovery_interval, help="N or a time")
    side: Literal["left", "right"] | None = option("--side", default=None, help="a choice from its annotation")


def planted_parser() -> argparse.ArgumentParser:
    parser = OneLineParser()
    add_declared(parser.add_argument_group(Planted.title), Planted)
    return parser


def test_the_parser_reads_each_declared_type() -> None:
    args = planted_parser().parse_args(
        [
            "--warmup",
            "7",
            "--floor",
            "0.5",
            "--ema",
            "--ms",
            "1",
            "2",
            "--mode",
            "b",
            "--extra",
            "k=1",
            "--every",
            "30m",
            "--side",
            "right",
        ]
    )
    assert vars(args) == {
        "warmup": 7,
        "floor": 0.5,
        "ema": True,
        "milestones": [1, 2],
        "mode": "b",
        "extra": {"k": 1},
        "every": "30m",
        "side": "right",
    }


def test_the_defaults_are_the_fields_defaults() -> None:
    assert vars(planted_parser().parse_args([])) == dataclasses.asdict(Planted())


def test_a_value_of_the_wrong_type_is_refused_by_argparse() -> None:
    for argv in (["--warmup", "1.5"], ["--floor", "half"], ["--mode", "c"], ["--every", "soon"], ["--side", "up"]):
        with pytest.raises(UsageError):
            planted_parser().parse_args(argv)


def test_resume_and_ranges_come_from_the_declaration() -> None:
    """The parser refuses an out-of-range value as it reads it (OneLineParser checks every declared range)."""
    parser = planted_parser()
    assert resume_changeable(parser) == {"ema"}
    assert parser.parse_args(["--floor", "1"]).floor == 1.0
    with pytest.raises(UsageError, match=r"^--warmup must be a positive integer, got 0$"):
        parser.parse_args(["--warmup", "0"])
    with pytest.raises(UsageError, match=r"^--floor must be from 0 to 1, got 1.5$"):
        parser.parse_args(["--floor", "1.5"])
    with pytest.raises(UsageError, match=r"^--floor must be a finite number, got nan$"):
        parser.parse_args(["--floor", "nan"])


def test_a_command_changes_a_shared_declaration_but_not_its_range() -> None:
    parser = OneLineParser()
    add_declared(parser, Planted, only=("warmup",), changes={"warmup": {"default": 9, "help": "mine"}})
    assert parser.get_default("warmup") == 9 and parser._option_string_actions["--warmup"].help == "mine"
    with pytest.raises(UsageError, match="--warmup must be a positive integer"):
        parser.parse_args(["--warmup", "0"])
    with pytest.raises(TypeError, match="not .*allowed"):
        add_declared(OneLineParser(), Planted, only=("warmup",), changes={"warmup": {"allowed": None}})


# ---------------------------------------------------------------- train.py's declared ranges, one row per option

# flags -> the one line train.py stops with; each value reached timm and failed there (a traceback) or trained
# something no recipe means, before its range was declared
OUT_OF_RANGE = [
    (["--sched", "step", "--decay-epochs", "0"], "--decay-epochs must be greater than 0, got 0.0"),
    (["--recount", "-1", "--reprob", "0.5"], "--recount must be a positive integer, got -1"),
    (["--recount", "0"], "--recount must be a positive integer, got 0"),
    (["--opt-eps", "-1"], "--opt-eps must be 0 or more, got -1.0"),
    (["--opt-betas", "0.9", "1.5"], "--opt-betas takes values from 0 up to (not including) 1, got 0.9 1.5"),
    (["--decay-rate", "-0.1"], "--decay-rate must be 0 or more, got -0.1"),
    (["--patience-epochs", "-1"], "--patience-epochs must be 0 or more, got -1"),
    (["--lr-base-size", "0"], "--lr-base-size must be a positive integer, got 0"),
    (["--lr-cycle-mul", "0"], "--lr-cycle-mul must be greater than 0, got 0.0"),
    (["--lr-cycle-decay", "-1"], "--lr-cycle-decay must be 0 or more, got -1.0"),
    (["--lr-cycle-limit", "0"], "--lr-cycle-limit must be a positive integer, got 0"),
    (["--lr-k-decay", "-1"], "--lr-k-decay must be greater than 0, got -1.0"),
    (["--lr-noise-pct", "-1"], "--lr-noise-pct must be 0 or more, got -1.0"),
    (["--lr-noise-std", "-1"], "--lr-noise-std must be 0 or more, got -1.0"),
    (["--layer-decay", "0"], "--layer-decay must be greater than 0, got 0.0"),
    (["--layer-decay-min-scale", "-1"], "--layer-decay-min-scale must be 0 or more, got -1.0"),
    (["--layer-decay-no-opt-scale", "-1"], "--layer-decay-no-opt-scale must be 0 or more, got -1.0"),
    (["--bn-momentum", "2"], "--bn-momentum must be from 0 to 1, got 2.0"),
    (["--bn-eps", "0"], "--bn-eps must be greater than 0, got 0.0"),
    (["--mixup-off-epoch", "-1"], "--mixup-off-epoch must be 0 or more, got -1"),
    (["--bce-target-thresh", "2"], "--bce-target-thresh must be from 0 to 1, got 2.0"),
    (["--bce-pos-weight", "-1"], "--bce-pos-weight must be 0 or more, got -1.0"),
    (["--start-epoch", "-1"], "--start-epoch must be 0 or more, got -1"),
    (["--checkpoint-hist", "-1"], "--checkpoint-hist must be 0 or more, got -1"),
    (["--distill-loss-weight", "-1"], "--distill-loss-weight must be 0 or more, got -1.0"),
    (["--task-loss-weight", "-1"], "--task-loss-weight must be 0 or more, got -1.0"),
    (["--threads", "100000"], "--threads must be from 1 to 1024, got 100000"),
    (["--threads", "0"], "--threads must be from 1 to 1024, got 0"),
]

# the edges each range still admits (timm's defaults are checked by parsing no flags at all)
IN_RANGE = [
    ["--sched", "step", "--decay-epochs", "0.5", "--decay-rate", "0"],
    ["--recount", "3", "--opt-eps", "0", "--opt-betas", "0", "0.999", "0.99"],
    ["--patience-epochs", "0", "--lr-cycle-limit", "1", "--lr-cycle-mul", "0.5", "--lr-k-decay", "2"],
    ["--bn-momentum", "0", "--bn-eps", "1e-5", "--bce-target-thresh", "1", "--start-epoch", "0"],
    ["--checkpoint-hist", "0", "--threads", "1", "--layer-decay", "0.65"],
]

# declared numbers of train.py free of a declared range, with why (a new option must take a range or a row here)
NO_RANGE = {
    "head_init_scale": "any scale, a negative one flips the classifier's initial weights",
    "head_init_bias": "any initial bias: a log-prior is negative",
    "decay_milestones": "epochs in any order: timm sorts them, and one past the last epoch never decays",
    "lr_noise": "fractions or epochs of the schedule, as timm reads either",
    "recovery_interval": "its parsing type (values.recovery_interval) refuses what is not N or a time",
    "dist_timeout": "its parsing type (values.collective_seconds) bounds it",
    "mean": "any value per channel: normalization only subtracts it (--std, which it divides by, has a range)",
}


def _train(*argv: str):  # noqa: ANN202 - the Namespace train.py checks
    from vtools.cli.train_flags import parse

    return parse(["--data-dir", str(REPO / "data" / "fashion-mnist-mini"), *argv])


@pytest.mark.parametrize(("argv", "error"), OUT_OF_RANGE, ids=[" ".join(argv) for argv, _ in OUT_OF_RANGE])
def test_a_value_timm_fails_on_is_refused_in_one_line(argv: list[str], error: str) -> None:
    with pytest.raises(UsageError) as refused:
        _train(*argv)
    assert str(refused.value) == error


@pytest.mark.parametrize("argv", [[], *IN_RANGE], ids=["defaults", *(" ".join(argv) for argv in IN_RANGE)])
def test_every_valid_value_and_timms_defaults_pass(argv: list[str]) -> None:
    _train(*argv)


def declared_concerns() -> list[type]:
    """Every concern of vtools/options/: the dataclasses whose fields declare options."""
    import dataclasses
    import importlib
    import inspect
    import pkgutil

    import vtools.options

    found = []
    for module_info in pkgutil.iter_modules(vtools.options.__path__):
        module = importlib.import_module(f"vtools.options.{module_info.name}")
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == module.__name__ and dataclasses.is_dataclass(cls):
                found.append(cls)
    return found


def numbers_without_a_range(concerns: list[type]) -> set[str]:
    """The declared numbers and number lists of ``concerns`` that take any value (timm's inert flags aside)."""
    import typing

    from vtools.options.declare import declared_fields

    free = set()
    for concern in concerns:
        hints = typing.get_type_hints(concern)
        for field, declared in declared_fields(concern):
            kinds = [kind for kind in typing.get_args(hints[field.name]) if kind is not type(None)]
            kinds = [typing.get_args(kind)[0] if typing.get_origin(kind) is list else kind for kind in kinds]
            numeric = any(kind in (int, float) for kind in kinds or [hints[field.name]])
            inert = declared.refused is not None or declared.no_op is not None  # only timm's default runs
            if numeric and declared.allowed is None and not inert:
                free.add(field.name)
    return free


def test_every_declared_number_has_a_range_or_a_reason() -> None:
    """Every command's numbers, not only train.py's: a value torch or timm would refuse deeper down is
    refused as the flag is read (the seed that overflowed torch.manual_seed was one)."""
    assert len(declared_concerns()) >= 20  # the walk reaches the tools' and the shared concerns
    assert numbers_without_a_range(declared_concerns()) == set(NO_RANGE)


def test_a_number_declared_without_a_range_is_found() -> None:
    """Planted: a seed declared without its range."""
    import dataclasses

    from vtools.options.declare import option

    field = option("--seed", default=42, help="random seed")
    planted = dataclasses.make_dataclass("Planted", [("seed", int, field)], frozen=True, kw_only=True)
    assert numbers_without_a_range([planted]) == {"seed"}
