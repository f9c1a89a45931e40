"""The commands stay thin: they parse, print and call. No function in vtools/commands/ is longer than
MAX_LINES; the training run's verbs live in vtools/train/run.py, the evaluation in vtools/evaluation/."""

from __future__ import annotations

import ast

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.cpu_only(reason="reads source files; runs nothing on a device")

MAX_LINES = 60
COMMANDS = REPO / "vtools" / "commands"

# functions still over the limit, each to be shrunk (issue 34); the test fails once one fits, so the list
# only shrinks: remove the entry then
STILL_LONG: set[str] = set()


def long_functions(source: str, limit: int = MAX_LINES) -> dict[str, int]:
    """Every function (methods and nested ones too) longer than ``limit`` lines, from its ``def`` line
    to its last, with its length."""
    return {
        node.name: node.end_lineno - node.lineno + 1
        for node in ast.walk(ast.parse(source))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > limit
    }


def commands_long_functions() -> dict[str, int]:
    return {
        f"{path.name}::{name}": length
        for path in sorted(COMMANDS.glob("*.py"))
        for name, length in long_functions(path.read_text(encoding="utf-8")).items()
    }


def test_no_command_function_is_longer_than_the_limit() -> None:
    found = commands_long_functions()
    new = {name: length for name, length in found.items() if name not in STILL_LONG}
    assert not new, f"functions in vtools/commands/ over {MAX_LINES} lines (move the work into the library): {new}"


def test_the_list_of_long_functions_is_not_stale() -> None:
    fixed = sorted(STILL_LONG - set(commands_long_functions()))
    assert not fixed, f"these fit in {MAX_LINES} lines now (or are gone): remove them from STILL_LONG: {fixed}"


def test_the_check_counts_every_line_of_a_function() -> None:
    """A planted case: a 61-line function (and one nested in a class) is found, a 60-line one is not."""
    body = "".join(f"    x{i} = {i}\n" for i in range(59))
    fits = f"def fits():\n{body}"  # 60 lines
    assert long_functions(fits) == {}
    assert long_functions(f"def too_long():\n{body}    return 1\n") == {"too_long": 61}
    nested = "class Run:\n" + "".join(f"    {line}\n" for line in f"def verb(self):\n{body}    return 1".split("\n"))
    assert long_functions(nested) == {"verb": 61}


def test_the_training_command_holds_no_training_or_evaluation_calls() -> None:
    """commands/train.py calls the run's verbs; the epoch, the evaluation loop, the checkpoint state and the
    recipe's building blocks stay in vtools/train and vtools/evaluation."""
    source = (COMMANDS / "train.py").read_text(encoding="utf-8")
    called = {
        node.func.id if isinstance(node.func, ast.Name) else node.func.attr
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call) and isinstance(node.func, (ast.Name, ast.Attribute))
    }
    library_work = {
        "train_one_epoch",
        "evaluate",
        "training_state",
        "build_model",
        "build_loaders",
        "build_components",
        "restore",
        "distribute_bn",
        "save",  # the checkpoint manager's
        "load_state_dict",
    }
    assert not called & library_work, sorted(called & library_work)
