"""vtools/options/declare.py: an option's declaration as a dataclass field, and its allowed values."""

from __future__ import annotations

import dataclasses

import pytest

from vtools.options.declare import (
    DROP_RATE,
    LOW_HIGH,
    POSITIVE,
    Allowed,
    between,
    declaration,
    declared_fields,
    default_of,
    no_op,
    option,
    refused,
)

pytestmark = pytest.mark.cpu_only(reason="dataclass declarations; nothing runs on a device")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Sample:
    shared: str  # filled by a flag declared elsewhere
    steps: int = option("--steps", "-s", default=3, allowed=POSITIVE, resume=True, help="steps")
    span: list[float] = option("--span", default=[0.1, 0.9], nargs="+", allowed=LOW_HIGH, help="a range")


def test_a_declaration_rides_on_its_field() -> None:
    fields = {f.name: f for f in dataclasses.fields(Sample)}
    assert declaration(fields["shared"]) is None
    steps = declaration(fields["steps"])
    assert (steps.flags, steps.resume, steps.allowed, steps.argparse) == (("--steps", "-s"), True, POSITIVE, {})
    assert declaration(fields["span"]).argparse == {"nargs": "+"}
    assert [f.name for f, _ in declared_fields(Sample)] == ["steps", "span"]


def test_a_list_default_is_a_fresh_copy_each_time() -> None:
    """As argparse gives each parse its own list, a changed default must not leak into the next job."""
    span = next(f for f in dataclasses.fields(Sample) if f.name == "span")
    first = default_of(span)
    first.append(5.0)
    assert default_of(span) == [0.1, 0.9] and Sample(shared="").span == [0.1, 0.9]


@pytest.mark.parametrize(
    ("allowed", "value", "error"),
    [
        (POSITIVE, 0, "--flag must be a positive integer, got 0"),
        (POSITIVE, 1, None),
        (POSITIVE, None, None),  # not given: the default's meaning, never refused
        (DROP_RATE, 1.0, "--flag must be from 0 up to (not including) 1, got 1.0"),
        (DROP_RATE, 0.99, None),
        (LOW_HIGH, [0.9, 0.1], "--flag takes two values, low and high, got 0.9 0.1"),
        (LOW_HIGH, [0.1, 0.5, 0.9], "--flag takes two values, low and high, got 0.1 0.5 0.9"),
        (LOW_HIGH, [0.1, 0.1], None),
    ],
)
def test_allowed_values_word_the_refusal(allowed, value, error) -> None:  # noqa: ANN001 - parametrized
    assert allowed.refusal("--flag", value) == error


def test_a_hint_follows_the_value_it_explains() -> None:
    percent = Allowed(lambda v: v <= 1, "must be at most 1", hint=lambda v: f" ({v:g} %?)" if v > 10 else "")
    assert percent.refusal("--pct", 50.0) == "--pct must be at most 1, got 50.0 (50 %?)"
    assert percent.refusal("--pct", 2.0) == "--pct must be at most 1, got 2.0"
    assert between(1, 8).refusal("--n", 9) == "--n must be from 1 to 8, got 9"


def test_refused_and_no_op_declarations_carry_their_reason_and_no_range() -> None:
    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Compat:
        old: int = refused("--old", default=0, reason="gone")
        idle: list[int] = no_op("--idle", default=[1], nargs="+", reason="nothing to do")

    old, idle = (found for _, found in declared_fields(Compat))
    assert (old.refused, old.no_op, old.allowed, old.help) == ("gone", None, None, "")
    assert (idle.no_op, idle.refused, idle.argparse) == ("nothing to do", None, {"nargs": "+"})
    assert Compat().idle == [1] and Compat().idle is not Compat().idle
