"""A flag several commands share is one declaration (vtools/options/shared.py and the training job's), so
its out-of-range value stops in one line, with the same words, in every command that has it.

The table below is written apart from the declarations: a range removed from one declaration (say
``--drop``'s) fails here for each command that has the flag (train and benchmark).
"""

from __future__ import annotations

import pytest

from vtools.cli import registry
from vtools.errors import UsageError

pytestmark = pytest.mark.cpu_only(reason="parses command lines; runs nothing on a device")

# flag -> (a value outside its range, the words its refusal must say)
OUT_OF_RANGE: dict[str, tuple[list[str], str]] = {
    "--batch-size": (["0"], "must be a positive integer, got 0"),
    "--workers": (["-1"], "must be 0 (load in the main process) or more, got -1"),
    "--log-freq": (["0"], "must be a positive integer, got 0"),
    "--img-size": (["0"], "must be a positive integer, got 0"),
    "--input-size": (["3", "0", "224"], "needs three positive numbers (channels height width), got 3 0 224"),
    "--crop-pct": (["50"], "got 50.0 (a percentage? 50 % is 0.5)"),
    "--std": (["0.5", "0", "0.5"], "must not be 0 (normalization divides by it)"),
    "--num-classes": (["0"], "must be a positive integer, got 0"),
    "--in-chans": (["-3"], "must be a positive integer, got -3"),
    "--threads": (["100000"], "must be from 1 to 1024, got 100000"),
    "--profile": (["-1"], "must be 0 (off) or a number of steps, got -1"),
    "--threshold": (["1.5"], "must be from 0 to 1, got 1.5"),
    "--drop": (["1.5"], "must be from 0 up to (not including) 1, got 1.5"),
    "--drop-path": (["1"], "must be from 0 up to (not including) 1, got 1.0"),
    "--drop-block": (["-0.1"], "must be from 0 up to (not including) 1, got -0.1"),
    "--opt-eps": (["-1"], "must be 0 or more, got -1.0"),
    "--opt-betas": (["0.9", "1.5"], "takes values from 0 up to (not including) 1, got 0.9 1.5"),
    "--momentum": (["1.5"], "must be from 0 to 1, got 1.5"),
    "--weight-decay": (["-1"], "must be 0 or more, got -1.0"),
    "--clip-grad": (["0"], "must be greater than 0, got 0.0"),
    "--smoothing": (["1"], "must be from 0 up to (not including) 1, got 1.0"),
    "--lr": (["-0.1"], "must be 0 or more, got -0.1"),
    "--seed": (["1180591620717411303424"], "must fit in 64 bits (from -2**63 up to 2**63), got 1180591620717411303424"),
}
# what each command needs besides the flag to parse at all (its required arguments)
REQUIRED = {
    "export": ["model", "--data", "images"],
    "shards": ["folder", "out"],
    "compare": ["a", "b"],
    "plot": ["run"],
}


def cases() -> list[tuple[str, str]]:
    found = []
    for known in registry.COMMANDS:
        flags = registry.build_parser(known.name)._option_string_actions
        found += [(known.name, flag) for flag, bad in OUT_OF_RANGE.items() if bad is not None and flag in flags]
    return found


CASES = cases()


@pytest.mark.parametrize("command, flag", CASES, ids=[f"{command} {flag}" for command, flag in CASES])
def test_a_shared_flags_out_of_range_value_stops_every_command_that_has_it(command: str, flag: str) -> None:
    values, words = OUT_OF_RANGE[flag]
    with pytest.raises(UsageError) as refused:
        registry.build_parser(command).parse_args([*REQUIRED.get(command, []), flag, *values])
    message = str(refused.value)
    assert message.startswith(f"{flag} ") and words in message and "\n" not in message, message


def test_every_shared_flag_in_the_table_is_checked_in_the_commands_that_share_it() -> None:
    """The table's flags reach several commands each; a flag that left every command is a stale row."""
    commands_of: dict[str, set[str]] = {}
    for command, flag in CASES:
        commands_of.setdefault(flag, set()).add(command)
    listed = {flag for flag, bad in OUT_OF_RANGE.items() if bad is not None}
    assert set(commands_of) == listed
    assert commands_of["--drop"] == {"train", "benchmark"}
    assert {"train", "validate", "infer", "benchmark", "parity"} <= commands_of["--batch-size"]
    assert {"validate", "infer", "benchmark", "parity", "train"} <= commands_of["--img-size"]


@pytest.mark.parametrize("command", ["validate", "infer", "benchmark"])
def test_an_allowed_value_of_a_shared_flag_parses(command: str) -> None:
    parsed = registry.build_parser(command).parse_args(["--img-size", "64", "--batch-size", "3"])
    assert (parsed.img_size, parsed.batch_size) == (64, 3)


def test_a_command_keeps_its_own_default_for_a_shared_flag() -> None:
    defaults = {name: registry.build_parser(name).get_default("batch_size") for name in ("train", "validate", "parity")}
    assert defaults == {"train": 128, "validate": 256, "parity": 8}
