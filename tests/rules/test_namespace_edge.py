"""The argparse Namespace stops at the command line's edge, vtools/cli/: no other module, the commands and the
Python API included, takes one, builds one or changes one. A command runs with its typed options (train.py's
job, every other command's generated dataclass: vtools/cli/typed.py), library functions with the frozen
option dataclasses they declare, so a signature says which options it reads."""

from __future__ import annotations

import ast

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.cpu_only(reason="reads source files; runs nothing on a device")

EDGE = ("vtools/cli/",)
# the one mention allowed elsewhere: timm's checkpoints pickle its args object, whose class the safe loader
# must name to read them (a file format, not a carrier of options)
TIMM_CHECKPOINT_TYPES = "vtools/models/weights.py"
NAMESPACE_PARAMETERS = {"args", "namespace", "train_args", "options_namespace"}


def _is_namespace(node: ast.AST | None) -> bool:
    text = ast.unparse(node) if node is not None else ""
    return text.strip("'\"") in ("argparse.Namespace", "Namespace")


def namespace_uses(source: str) -> list[str]:
    """Where ``source`` takes, builds or changes a Namespace: ``line: what``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            arguments = node.args
            for arg in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]:
                if _is_namespace(arg.annotation) or (arg.annotation is None and arg.arg in NAMESPACE_PARAMETERS):
                    found.append(f"{node.lineno}: {node.name}() takes a Namespace ({arg.arg})")
        elif isinstance(node, ast.Call) and _is_namespace(node.func):
            found.append(f"{node.lineno}: builds a Namespace")
        elif isinstance(node, ast.Call) and ast.unparse(node.func) in ("setattr", "vars") and node.args:
            if ast.unparse(node.args[0]) in NAMESPACE_PARAMETERS:
                found.append(f"{node.lineno}: {ast.unparse(node.func)}() on a Namespace")
        elif isinstance(node, (ast.Assign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Attribute) and ast.unparse(target.value) in NAMESPACE_PARAMETERS:
                    found.append(f"{node.lineno}: changes {ast.unparse(target)}")
    return found


def test_no_module_below_the_command_line_names_the_namespace() -> None:
    """As ``grep -rn Namespace vtools/`` reads it: only vtools/cli/ (and the checkpoint reader's list)."""
    named = [
        path.relative_to(REPO).as_posix()
        for path in sorted((REPO / "vtools").rglob("*.py"))
        if "Namespace" in path.read_text(encoding="utf-8")
    ]
    outside = [name for name in named if not name.startswith(EDGE) and name != TIMM_CHECKPOINT_TYPES]
    assert outside == [], f"the Namespace named below vtools/cli/: {outside}"
    assert "vtools/cli/typed.py" in named  # the check reads what it means to


def test_no_library_function_takes_or_changes_a_namespace() -> None:
    offenders = []
    for path in sorted((REPO / "vtools").rglob("*.py")):
        name = path.relative_to(REPO).as_posix()
        if not name.startswith(EDGE):
            offenders += [f"{name}:{where}" for where in namespace_uses(path.read_text(encoding="utf-8"))]
    assert not offenders, "the Namespace goes past the command edge:\n" + "\n".join(offenders)


PLANTED = """
import argparse

def build_model(args: argparse.Namespace, num_classes: int):
    return args.model

def loaders(args, workers):
    args.batch_size = 8

def copy(options):
    return argparse.Namespace(**{**vars(args), "lr": 1})

def fine(options: "RuntimeOptions", args_count: int, *args):
    return options.device

def hook(module, args: tuple):
    return args
"""


def test_the_check_finds_each_planted_case() -> None:
    assert namespace_uses(PLANTED) == [
        "4: build_model() takes a Namespace (args)",
        "7: loaders() takes a Namespace (args)",
        "8: changes args.batch_size",
        "11: builds a Namespace",
        "11: vars() on a Namespace",
    ]


def test_the_edge_may_keep_its_namespace() -> None:
    assert namespace_uses("def parse(argv) -> None:\n    return None\n") == []
    assert namespace_uses((REPO / "vtools/cli/typed.py").read_text(encoding="utf-8"))  # the edge does take one
