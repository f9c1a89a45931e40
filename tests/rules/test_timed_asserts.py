"""No test asserts how fast the code runs: speed is measured in benchmarks, which print figures, and a loaded
machine would fail a timed test for no defect. A test may bound a wait that could otherwise never end (a hang,
a stalled server) and check that a wait happened; each such test is named below with why, and bounds generously.

Found on the test sources: an ``assert`` comparing a clock difference (``time.perf_counter() - t``,
``time.monotonic() - t``, ``time.time() - t``, directly or through a name assigned from one).
"""

from __future__ import annotations

import ast

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.cpu_only(reason="reads the test sources")

CLOCKS = {"perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns", "time", "time_ns"}
BOUNDED_WAITS = {
    "tests/observe/test_mlflow_tracker.py::"
    "test_validation_with_no_server_writes_its_results_and_says_what_was_not_logged": (
        "an unreachable tracking server must not stall validation past the tracker's own start bound "
        "(START_SECONDS) and two minutes for the validation on a loaded host"
    ),
    "tests/observe/test_tracking.py::test_a_start_that_never_returns_is_bounded_and_the_end_does_not_wait_for_it": (
        "a tracker whose start never returns is given up after 0.3 s; 5 s means it was not waited for"
    ),
    "tests/observe/test_tracking.py::test_an_end_that_hangs_is_cut_at_the_wait_and_named": (
        "a tracker whose end hangs is cut after 0.3 s; 5 s means the close did not hang"
    ),
    "tests/runtime/test_heartbeat.py::test_the_thread_ends_the_process_and_reports_the_logged_step": (
        "a silent rank is declared dead after its timeout, not before, and not a whole timeout late"
    ),
    "tests/runtime/test_heartbeat.py::test_a_silent_store_ends_the_job_without_hanging": (
        "a store call that never returns is cut at its own timeout (plus 2 s)"
    ),
    "tests/scripts/test_hang.py::test_a_stopped_rank_ends_the_job_in_one_line": (
        "a stopped rank ends the job within --dist-timeout and 30 s, where torch alone would wait forever"
    ),
    "tests/train/test_loop.py::test_the_log_figures_are_this_epochs_speed_and_rate": (
        "the logged img/s is checked against the epoch's own wall time: a consistency bound, not a speed"
    ),
    "tests/train/test_recovery.py::test_a_recovery_save_waits_for_the_write_in_flight_and_counts_the_wait": (
        "a lower bound: the second save did wait for the first write (released after 0.3 s)"
    ),
}


def _is_clock(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in CLOCKS
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "time"
    )


def _is_elapsed(node: ast.AST) -> bool:
    return isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub) and _is_clock(node.left)


def timed_asserts(source: str, name: str) -> list[str]:
    """'name::function' for each test function in ``source`` that asserts on a clock difference."""
    found = []
    for function in ast.walk(ast.parse(source)):
        if not isinstance(function, ast.FunctionDef):
            continue
        elapsed = {
            target.id
            for node in ast.walk(function)
            if isinstance(node, ast.Assign) and _is_elapsed(node.value)
            for target in node.targets
            if isinstance(target, ast.Name)
        }
        for statement in ast.walk(function):
            if isinstance(statement, ast.Assert) and any(
                _is_elapsed(node) or (isinstance(node, ast.Name) and node.id in elapsed)
                for node in ast.walk(statement.test)
            ):
                found.append(f"{name}::{function.name}")
                break
    return found


def test_only_the_named_bounded_waits_assert_on_a_clock() -> None:
    found = []
    for path in sorted((REPO / "tests").rglob("*.py")):
        found += timed_asserts(path.read_text(encoding="utf-8"), path.relative_to(REPO).as_posix())
    unnamed = sorted(set(found) - set(BOUNDED_WAITS))
    assert not unnamed, "timed asserts (measure speed in a benchmark instead):\n" + "\n".join(unnamed)
    stale = sorted(set(BOUNDED_WAITS) - set(found))
    assert not stale, f"named bounded waits that no longer time anything: {stale}"


def test_the_rule_finds_a_timed_assert_directly_and_through_a_name() -> None:
    source = """
import time
def test_fast():
    start = time.perf_counter()
    work()
    took = time.perf_counter() - start
    assert took < 0.5
def test_direct():
    began = time.monotonic()
    assert time.monotonic() - began < 5
def test_polls_until_a_deadline():
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        pass
"""
    assert timed_asserts(source, "t.py") == ["t.py::test_fast", "t.py::test_direct"]
