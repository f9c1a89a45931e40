"""Every option of every command is declared once (vtools/options/) and its parser generated: no command
holds a flag that is not a declaration, ``add_argument`` is called only by the generator, a spelling two
declarations share is a listed homonym (two meanings timm's scripts give one name), a shared flag carries
the same range in every command, and every command is in the one registry. The flags users have keep
their dest, default, type, nargs and choices (tests/data/command_flags.json, recorded by
tools/dump_parsers.py)."""

from __future__ import annotations

import argparse
import ast
import json

import pytest

from tests.conftest import REPO
from vtools.cli import registry
from vtools.options.declare import DECLARATION, declared_fields

pytestmark = pytest.mark.cpu_only(reason="builds parsers and reads source files; runs nothing on a device")

# one spelling, two options: each meaning is declared once, in the concern of the commands that have it
HOMONYMS = {
    "--results-file": "validate.py's is a path, inference.py's a name inside --results-dir (timm's two meanings)",
    "--results-format": "validate.py's is one format, inference.py's one or more (timm's)",
    "--output": "each tool writes its own kind of file: a PNG, a table, weights, an ONNX model",
    "-o": "the short --output of plot and compare",
    "--format": "shards: wds or parquet; compare: a table format; export: onnx",
    "--split": "the scripts' split to read; shards: the one split FOLDER is",
    "--model-list": "benchmark: a file or wildcard; bulk: also all, all_in1k, all_res (timm's bulk_runner)",
    "--pretrained": "the scripts: load pretrained weights; bulk: --model-list all keeps models that have them",
    "-m": "the scripts' --model; bulk's --module (timm's bulk_runner)",
    "--data": "parity: optional images for the batch; export: the images it must check (required)",
}


def test_every_command_is_registered_and_has_a_parser() -> None:
    modules = {path.stem for path in (REPO / "vtools" / "commands").glob("*.py")} - {"__init__"}
    assert modules == {known.module.rsplit(".", 1)[1] for known in registry.COMMANDS}
    for known in registry.COMMANDS:
        assert isinstance(registry.build_parser(known.name), argparse.ArgumentParser), known.name


@pytest.mark.parametrize("name", [known.name for known in registry.COMMANDS])
def test_every_flag_of_every_command_is_a_declaration(name: str) -> None:
    parser = registry.build_parser(name)
    undeclared = [
        "/".join(action.option_strings) or action.dest
        for action in parser._actions
        if not isinstance(action, argparse._HelpAction) and getattr(action, DECLARATION, None) is None
    ]
    assert not undeclared, f"{name}: flags added without a declaration: {undeclared}"


def add_argument_calls(source: str) -> list[int]:
    """The lines of ``source`` that call ``add_argument`` (``add_argument_group`` is not one)."""
    return [
        node.lineno
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "add_argument"
    ]


def test_add_argument_is_called_only_by_the_generator() -> None:
    generator = REPO / "vtools" / "cli" / "declared.py"
    found = [
        f"{path.relative_to(REPO)}:{line}"
        for path in sorted((REPO / "vtools").rglob("*.py"))
        if path != generator
        for line in add_argument_calls(path.read_text(encoding="utf-8"))
    ]
    assert not found, f"declare these options (vtools/options/) instead: {found}"
    assert add_argument_calls(generator.read_text(encoding="utf-8")), "the generator itself adds no argument"


def test_the_add_argument_rule_sees_a_planted_call() -> None:
    planted = 'def f(parser):\n    parser.add_argument_group("g")\n    parser.add_argument("--x")\n'
    assert add_argument_calls(planted) == [3]


def declarations_by_flag() -> dict[str, list[str]]:
    """Flag spelling -> the declarations (Concern.field) that carry it, over every module of vtools/options/."""
    import importlib

    found: dict[str, list[str]] = {}
    for path in sorted((REPO / "vtools" / "options").glob("*.py")):
        module = importlib.import_module(f"vtools.options.{path.stem}")
        for concern in vars(module).values():
            if (
                isinstance(concern, type)
                and concern.__module__ == module.__name__
                and hasattr(concern, "__dataclass_fields__")
            ):
                for field, declared in declared_fields(concern):
                    for flag in declared.flags:
                        if flag.startswith("-"):
                            found.setdefault(flag, []).append(f"{concern.__name__}.{field.name}")
    return found


def test_a_flag_is_declared_once_unless_it_is_a_listed_homonym() -> None:
    twice = {flag: where for flag, where in declarations_by_flag().items() if len(where) > 1}
    unlisted = {flag: where for flag, where in twice.items() if flag not in HOMONYMS}
    assert not unlisted, f"one option declared twice: share one declaration instead: {unlisted}"
    stale = set(HOMONYMS) - set(twice)
    assert not stale, f"listed homonyms now declared once: drop them from HOMONYMS: {stale}"


def test_a_shared_flag_has_the_same_declaration_in_every_command() -> None:
    """Commands may give a shared flag their own default or help, never their own range or type."""
    seen: dict[str, tuple[str, object, object]] = {}
    differing = []
    for known in registry.COMMANDS:
        for action in registry.build_parser(known.name)._actions:
            declared = getattr(action, DECLARATION, None)
            if declared is None or not action.option_strings or action.option_strings[0] in HOMONYMS:
                continue
            flag = action.option_strings[0]
            first = seen.setdefault(flag, (known.name, declared.allowed, action.type))
            if (first[1], first[2]) != (declared.allowed, action.type):
                differing.append(f"{flag}: {first[0]} and {known.name}")
    assert not differing, differing
    assert len(seen) > 100  # the walk saw the commands' flags


RECORDED = REPO / "tests" / "data" / "command_flags.json"


def test_every_recorded_flag_keeps_its_dest_default_type_nargs_and_choices() -> None:
    """A flag users have keeps what it means (new flags may come; tools/dump_parsers.py records them)."""
    from tools.dump_parsers import dump

    now = {name: {row["dest"]: row for row in rows} for name, rows in dump().items()}
    changed = []
    for name, flags in json.loads(RECORDED.read_text(encoding="utf-8")).items():
        for dest, recorded in flags.items():
            current = now.get(name, {}).get(dest)
            if current is None:
                changed.append(f"{name} {dest}: gone")
                continue
            changed += [
                f"{name} {dest}: {key} {recorded[key]!r} -> {current[key]!r}"
                for key in recorded
                if current[key] != recorded[key]
            ]
    assert not changed, changed
