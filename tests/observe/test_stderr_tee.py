"""vtools/observe/stderr_tee.py: what is written to file descriptor 2 still gets there, and each line is
handed to the callback exactly once."""

from __future__ import annotations

import os

import pytest

from vtools.observe.stderr_tee import SENTINEL, StderrTee, sentinel_prefix


def test_every_line_reaches_stderr_and_the_callback(capfd: pytest.CaptureFixture[str]) -> None:
    seen: list[str] = []

    def record(line: str) -> bool:
        seen.append(line)
        return False

    with StderrTee(record):
        os.write(2, b"first line\nsecond ")
        os.write(2, b"half\n")
        os.write(2, b"a tail without newline")
    os.write(2, b"\nafter the tee\n")
    assert capfd.readouterr().err == "first line\nsecond half\na tail without newline\nafter the tee\n"
    assert seen == ["first line\n", "second half\n", "a tail without newline"]


def test_whole_lines_lets_the_callback_keep_a_line_off_stderr(capfd: pytest.CaptureFixture[str]) -> None:
    with StderrTee(lambda line: "secret" in line, whole_lines=True):
        os.write(2, b"keep\na secret ")
        os.write(2, b"line\nkeep too\n")
    assert capfd.readouterr().err == "keep\nkeep too\n"


def test_without_whole_lines_nothing_is_held_back(capfd: pytest.CaptureFixture[str]) -> None:
    with StderrTee(lambda line: True):
        os.write(2, b"shown although the callback says drop\n")
    assert capfd.readouterr().err == "shown although the callback says drop\n"


def test_close_is_idempotent_and_a_tee_never_started_closes(capfd: pytest.CaptureFixture[str]) -> None:
    StderrTee(lambda line: False).close()
    tee = StderrTee(lambda line: False)
    with tee:
        os.write(2, b"once\n")
    tee.close()
    assert capfd.readouterr().err == "once\n"


def test_the_sentinel_split_across_reads_is_held_back() -> None:
    assert sentinel_prefix(b"text" + SENTINEL[:5]) == 5
    assert sentinel_prefix(b"text") == 0
