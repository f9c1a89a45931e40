"""tools/delete_calls.py, the statement-deletion pass: which statements it deletes, that the result still
parses and runs, how a mutant is judged against real tests (killed, survived), and the score's arithmetic."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.cpu_only(reason="a script reading and running Python files")

SOURCE = """\
class Counter:
    def __init__(self):
        self.seen = []

    def add(self, value):
        self.seen.append(value)
        return len(self.seen)


def fill(counter, values):
    for value in values:
        counter.add(value)
    total = sum(values)  # an assignment: kept
    print("filled")
    return total


def untouched(counter):
    counter.add(0)
"""

TEST = """\
from toy import Counter, fill


def test_fill_adds_every_value():
    counter = Counter()
    assert fill(counter, [1, 2]) == 3
    assert counter.seen == [1, 2]
"""


@pytest.fixture(scope="module")
def tool():
    spec = importlib.util.spec_from_file_location("delete_calls", REPO / "tools" / "delete_calls.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["delete_calls"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def test_only_call_statements_in_the_named_functions_are_found(tool) -> None:
    found = tool.call_statements(SOURCE, "toy.py", ["fill", "Counter.*"])
    assert [(m.function, m.text) for m in found] == [
        ("Counter.add", "self.seen.append(value)"),
        ("fill", "counter.add(value)"),
        ("fill", "print('filled')"),
    ]
    assert found[1].id == "toy.py::fill::counter.add(value)"


def test_a_repeated_call_gets_its_own_id(tool) -> None:
    source = "def f(x):\n    x.step()\n    x.step()\n"
    assert [m.id for m in tool.call_statements(source, "m.py", ["f"])] == ["m.py::f::x.step()", "m.py::f::x.step() #2"]


def test_a_call_in_a_nested_function_is_one_mutant_under_the_nested_name(tool) -> None:
    source = "def outer(x):\n    def inner():\n        x.update()\n    x.step()\n    return inner\n"
    assert [m.id for m in tool.call_statements(source, "m.py", ["outer*"])] == [
        "m.py::outer.inner::x.update()",
        "m.py::outer::x.step()",
    ]


def test_a_deleted_statement_leaves_code_that_parses(tool) -> None:
    source = "def f(x):\n    if x:\n        x.update(\n            1,\n        )\n    return x\n"
    (mutant,) = tool.call_statements(source, "m.py", ["f"])
    result = tool.deleted(source, mutant)
    assert result == "def f(x):\n    if x:\n        pass\n    return x\n"
    ast.parse(result)


def test_mutants_are_judged_by_real_tests(tool, tmp_path: Path) -> None:
    """Deleting ``counter.add(value)`` breaks the test (killed); deleting the print does not (survived)."""
    (tmp_path / "toy.py").write_text(SOURCE)
    (tmp_path / "test_toy.py").write_text(TEST)
    (tmp_path / "conftest.py").write_text("")
    found = {m.text: m for m in tool.call_statements(SOURCE, "toy.py", ["fill"])}
    assert tool.run_mutant(found["counter.add(value)"], tmp_path, ["test_toy.py"], timeout=120) == "killed"
    assert tool.run_mutant(found["print('filled')"], tmp_path, ["test_toy.py"], timeout=120) == "survived"
    assert (tmp_path / "toy.py").read_text() == SOURCE  # restored after each


def test_a_test_named_by_node_id_runs_in_any_tier_after_the_files(tool, tmp_path: Path) -> None:
    """A slow test is left out of a file's fast tier, and run when named: the print's deletion survives the
    fast file and dies in the named slow test."""
    (tmp_path / "toy.py").write_text(SOURCE)
    (tmp_path / "test_toy.py").write_text(TEST)
    slow = "import pytest\nfrom toy import Counter, fill\n\n\n@pytest.mark.slow\ndef test_says_filled(capsys):\n"
    slow += "    fill(Counter(), [1])\n    assert capsys.readouterr().out == 'filled\\n'\n"
    (tmp_path / "test_slow.py").write_text(slow)
    (tmp_path / "conftest.py").write_text("")
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    slow: whole runs\n")
    found = {m.text: m for m in tool.call_statements(SOURCE, "toy.py", ["fill"])}
    printed = found["print('filled')"]
    assert tool.run_mutant(printed, tmp_path, ["test_toy.py", "test_slow.py"], timeout=120) == "survived"
    named = ["test_toy.py", "test_slow.py::test_says_filled"]
    assert tool.run_mutant(printed, tmp_path, named, timeout=120) == "killed"
    assert tool.run_mutant(printed, tmp_path, ["test_slow.py"], timeout=120) == "no tests"


def test_the_table_counts_each_module_and_scores_without_its_equivalents(tool) -> None:
    outcomes = {"a.py::f::x()": "killed", "a.py::f::y()": "survived", "b.py::g::z()": "killed"}
    lines = tool.table(outcomes, {"a.py::f::w()": "why"}).splitlines()
    assert lines[2:] == ["| `a.py` | 3 | 1 | 1 | 1 | 50.0 % |", "| `b.py` | 1 | 1 | 0 | 0 | 100.0 % |"]


def test_the_score_leaves_equivalents_out(tool, tmp_path: Path) -> None:
    outcomes = {"a": "killed", "b": "survived", "c": "survived", "d": "no tests"}
    assert tool.score(outcomes, {}) == (25.0, ["b", "c", "d"])
    assert tool.score(outcomes, {"b": "why", "c": "why"}) == (50.0, ["d"])
    (tmp_path / "eq.txt").write_text("# comment\nm.py::f::bar.set_postfix(x=1)  # a progress bar\n")
    assert tool.read_equivalents(tmp_path / "eq.txt") == {"m.py::f::bar.set_postfix(x=1)": "a progress bar"}


def test_the_scope_finds_the_training_steps_calls(tool) -> None:
    """The calls whose deletion the issue names are among the mutants: the EMA update, the optimizer step."""
    ids = {m.id for m in tool.all_mutants()}
    assert "vtools/train/loop.py::train_one_epoch::parts.ema.update(unwrap(model), step=num_updates)" in ids
    assert "vtools/train/loop.py::_optimizer_step::parts.optimizer.step()" in ids
    for module, (_, tests) in tool.SCOPE.items():
        assert (REPO / module).is_file() and all((REPO / test.partition("::")[0]).is_file() for test in tests), module


def test_every_listed_equivalent_is_a_mutant_in_scope_with_a_reason(tool) -> None:
    equivalents = tool.read_equivalents()
    ids = {m.id for m in tool.all_mutants()}
    assert equivalents, "tests/data/deletion_equivalents.txt lists none"
    for name, reason in equivalents.items():
        assert name in ids, f"{name} is no mutant of the scope (renamed or moved?)"
        assert len(reason.split()) >= 5, f"{name}: give the reason no test can observe it"
