"""vtools/cli/declared.py: train.py's own flags generated from their declarations, and their checks.

Adding a plain flag is one declaration plus the code that reads it: the tests below declare a concern of
their own, as a new option would be declared in vtools/options/train_job.py, and use the parser made from it.
"""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from vtools.cli.declared import add_declared, check_declared
from vtools.cli.options import resume_changeable
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


def planted_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
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
    }


def test_the_defaults_are_the_fields_defaults() -> None:
    assert vars(planted_parser().parse_args([])) == dataclasses.asdict(Planted())


def test_a_value_of_the_wrong_type_is_refused_by_argparse() -> None:
    for argv in (["--warmup", "1.5"], ["--floor", "half"], ["--mode", "c"], ["--every", "soon"]):
        with pytest.raises(SystemExit):
            planted_parser().parse_args(argv)


def test_resume_and_ranges_come_from_the_declaration() -> None:
    parser = planted_parser()
    assert resume_changeable(parser) == {"ema"}
    check_declared(parser.parse_args(["--floor", "1"]), Planted)
    with pytest.raises(UsageError, match=r"^--warmup must be a positive integer, got 0$"):
        check_declared(parser.parse_args(["--warmup", "0"]), Planted)
    with pytest.raises(UsageError, match=r"^--floor must be from 0 to 1, got 1.5$"):
        check_declared(parser.parse_args(["--floor", "1.5"]), Planted)
