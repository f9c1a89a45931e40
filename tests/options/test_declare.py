"""vtools/options/declare.py: an option's declaration as a dataclass field, and its allowed values."""

from __future__ import annotations

import dataclasses

import pytest

from vtools.options.declare import (
    DROP_RATE,
    LOW_HIGH,
    POSITIVE,
    declaration,
    declared_fields,
    default_of,
    option,
    refusals,
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


def test_refusals_name_each_declared_field_out_of_range_in_order() -> None:
    given = {"shared": "x", "steps": 0, "span": [2.0, 1.0]}
    assert refusals(Sample, given.__getitem__) == [
        "--steps must be a positive integer, got 0",
        "--span takes two values, low and high, got 2.0 1.0",
    ]
    assert refusals(Sample, {"steps": 1, "span": [1.0, 2.0]}.__getitem__) == []
