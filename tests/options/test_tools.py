"""The project tools' own options (vtools/options/tools.py): each value no tool can use stops in one line
as the parser reads it, before any file is opened or model built; the values they can use parse."""

from __future__ import annotations

import re

import pytest

from vtools.cli import registry
from vtools.errors import UsageError

pytestmark = pytest.mark.cpu_only(reason="parses command lines; runs nothing on a device")

# (command, argv, the refusal's words)
REFUSED = [
    ("shards", ["in", "out", "--shard-size", "0"], "--shard-size must be a positive integer, got 0"),
    ("shards", ["in", "out", "--max-side", "-5"], "--max-side must be a positive integer, got -5"),
    ("shards", ["in", "out", "--workers", "-1"], "--workers must be 0 (load in the main process) or more, got -1"),
    ("compare", ["a", "b", "--top", "-1"], "--top must be 0 or more, got -1"),
    ("avg-checkpoints", ["-n", "0"], "-n must be 1 or more, got 0"),
    ("export", ["m", "--data", "d", "--atol", "-1"], "--atol must be 0 or more, got -1.0"),
    ("export", ["m", "--data", "d", "--rtol", "-0.5"], "--rtol must be 0 or more, got -0.5"),
    ("export", ["m", "--data", "d", "--opset", "0"], "--opset must be a positive integer, got 0"),
    ("export", ["m", "--data", "d", "--check-images", "0"], "--check-images must be 1 or more, got 0"),
    ("bulk", ["--delay", "-1", "validate.py"], "--delay must be a number of seconds, 0 or more, got -1.0"),
    ("bulk", ["--delay", "nan", "validate.py"], "--delay must be a finite number, got nan"),
    ("parity", ["m", "--steps", "0"], "--steps must be 1 or more, got 0"),
    ("parity", ["m", "--tol", "-1"], "--tol must be 0 or more, got -1.0"),
    ("parity", ["m", "--grad-tol", "-0.001"], "--grad-tol must be 0 or more, got -0.001"),
    ("parity", ["m", "--lr", "-1"], "--lr must be 0 or more, got -1.0"),
]


@pytest.mark.parametrize("command, argv, words", REFUSED, ids=[f"{c} {' '.join(a)}" for c, a, _ in REFUSED])
def test_a_value_no_tool_can_use_stops_in_one_line(command: str, argv: list[str], words: str) -> None:
    with pytest.raises(UsageError, match=f"^{re.escape(words)}$"):
        registry.build_parser(command).parse_args(argv)


def test_the_tools_defaults_are_timms_and_parse() -> None:
    avg = registry.build_parser("avg-checkpoints").parse_args([])
    assert (avg.n, avg.output, avg.filter) == (10, "./averaged.pth", "*.pth.tar")
    clean = registry.build_parser("clean-checkpoint").parse_args([])
    assert clean.output == ""  # clean-checkpoint names its file from the checkpoint's (its own default)
    bulk = registry.build_parser("bulk").parse_args(["--delay", "0", "validate.py", "--model", "x"])
    assert (bulk.delay, bulk.script, bulk.script_args) == (0, "validate.py", ["--model", "x"])
    shards = registry.build_parser("shards").parse_args(["in", "out"])
    assert (shards.shard_size, shards.workers, shards.format) == (1000, None, "wds")
