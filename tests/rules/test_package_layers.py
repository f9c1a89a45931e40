"""The package's architecture, enforced: layers import downward only, no import cycles, importing has no
side effects, and the README's layout table names every module."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.conftest import REPO, run_script

pytestmark = pytest.mark.cpu_only(reason="reads source files and imports modules; runs nothing on a device")

# lowest first; a module may import its own layer and the layers before it (vtools/__init__.py says why)
LAYERS = (
    (
        "vtools.errors",
        "vtools.optional",
        "vtools.progress",
        "vtools.atomic",
        "vtools.run_ledger",
        "vtools.run_events",
        "vtools.derived_options",
        "vtools.outputs",
        "vtools.results",
    ),
    ("vtools.runtime",),
    ("vtools.options",),
    ("vtools.cli",),
    ("vtools.models",),
    ("vtools.data",),
    ("vtools.evaluation",),
    ("vtools.observe",),  # below train: it reads the run's events (vtools/run_events.py), never the training code
    ("vtools.train", "vtools.deploy"),
    ("vtools.commands",),
    ("vtools.api", "vtools.__main__"),
)


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> int:
    for rank, prefixes in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return rank
    raise AssertionError(f"{module} belongs to no layer: add it to LAYERS and to vtools/__init__.py")


def vtools_imports(path: Path) -> set[str]:
    """Every vtools module ``path`` imports, at module level or inside functions."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("vtools.")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("vtools"):
            if node.module == "vtools":
                found |= {f"vtools.{a.name}" for a in node.names}
            else:
                found.add(node.module)
    return found


def import_graph(root: Path) -> dict[str, set[str]]:
    return {module_name(path): vtools_imports(path) for path in sorted(root.rglob("*.py"))}


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return [
        f"{module} imports {target}"
        for module, targets in graph.items()
        if module != "vtools"
        for target in sorted(targets)
        if layer_of(target) > layer_of(module)
    ]


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Import cycles between modules (depth-first search; each cycle reported once per entry point)."""
    found, done = [], set()

    def visit(module: str, stack: list[str]) -> None:
        if module in stack:
            found.append(stack[stack.index(module) :] + [module])
            return
        if module in done:
            return
        for target in graph.get(module, ()):
            visit(target, stack + [module])
        done.add(module)

    for module in graph:
        visit(module, [])
    return found


def test_every_module_imports_only_its_own_layer_or_lower() -> None:
    graph = import_graph(REPO / "vtools")
    for module in graph:  # every module has a layer
        layer_of(module) if module != "vtools" else None
    assert not upward_imports(graph), "\n".join(upward_imports(graph))


def test_there_are_no_import_cycles() -> None:
    assert cycles(import_graph(REPO / "vtools")) == []


def test_the_layer_rules_catch_an_upward_import_and_a_cycle() -> None:
    graph = {"vtools.data.loaders": {"vtools.train.loop"}, "vtools.train.loop": {"vtools.data.loaders"}}
    assert upward_imports(graph) == ["vtools.data.loaders imports vtools.train.loop"]
    assert cycles(graph)


# the command line is read in cli/ and turned into options at the command edge (commands/, the API, the
# `vtools` dispatcher); the library below takes typed options and never reaches back into argument parsing
READS_THE_COMMAND_LINE = ("vtools.cli", "vtools.commands", "vtools.api", "vtools.__main__")


def cli_importers(graph: dict[str, set[str]]) -> list[str]:
    """Modules outside the command edge that import vtools.cli."""
    return [
        f"{module} imports {target}"
        for module, targets in graph.items()
        if not any(module == edge or module.startswith(edge + ".") for edge in READS_THE_COMMAND_LINE)
        for target in sorted(targets)
        if target == "vtools.cli" or target.startswith("vtools.cli.")
    ]


def test_only_the_command_edge_imports_the_argument_parsing() -> None:
    graph = import_graph(REPO / "vtools")
    assert not cli_importers(graph), "\n".join(cli_importers(graph))
    planted = {"vtools.train.recipe": {"vtools.cli.train_flags"}, "vtools.commands.train": {"vtools.cli.typed"}}
    assert cli_importers(planted) == ["vtools.train.recipe imports vtools.cli.train_flags"]


def test_every_command_is_a_module_named_as_the_command() -> None:
    from vtools.cli.registry import COMMANDS

    modules = {path.stem for path in (REPO / "vtools" / "commands").glob("*.py")} - {"__init__"}
    assert modules == {known.module.rsplit(".", 1)[1] for known in COMMANDS}


PROBE = """
import atexit, importlib, pkgutil, signal, sys
import vtools
assert "torch" not in sys.modules, "import vtools imported torch"
handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD)}
registered = atexit._ncallbacks()
names = [m.name for m in pkgutil.walk_packages(vtools.__path__, "vtools.")]
for name in names:
    importlib.import_module(name)
assert {s: signal.getsignal(s) for s in handlers} == handlers, "an import changed a signal handler"
print(len(names), atexit._ncallbacks() - registered)
"""


def test_importing_any_module_installs_nothing() -> None:
    """No handler, exit hook or exit at import: a command installs what it needs when it starts. (torch and
    its libraries register their own exit hooks when first imported, so the count is taken against a
    process that imported them first.)"""
    warm = "import torch, torchvision, timm, tqdm, safetensors, PIL.Image, yaml, numpy\n"
    proc = run_script(
        ["-c", warm + PROBE.replace('assert "torch" not in sys.modules, "import vtools imported torch"', "")]
    )
    assert proc.returncode == 0, proc.stderr
    count, hooks = map(int, proc.stdout.split())
    assert count > 40 and hooks == 0
    bare = run_script(["-c", "import sys, vtools; print('torch' in sys.modules)"])
    assert bare.returncode == 0 and bare.stdout.strip() == "False", bare.stderr


def layout_rows(readme: str) -> dict[str, set[str]]:
    """The README's layout table: package folder -> the module files its row names."""
    rows = {}
    for line in readme[readme.index("## Layout") :].splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        folder = re.fullmatch(r"`(vtools[\w/]*?)/?`", cells[0]) if line.startswith("|") else None
        if folder:
            rows[folder.group(1)] = set(re.findall(r"`(\w+\.py)`", " ".join(cells[1:])))
    return rows


def test_the_readme_layout_table_names_every_module() -> None:
    rows = layout_rows((REPO / "README.md").read_text(encoding="utf-8"))
    missing = [
        path.relative_to(REPO).as_posix()
        for path in sorted((REPO / "vtools").rglob("*.py"))
        if path.name != "__init__.py" and path.name not in rows.get(path.parent.relative_to(REPO).as_posix(), ())
    ]
    assert not missing, "README's layout table does not name: " + ", ".join(missing)
    assert layout_rows("## Layout\n| `vtools/data/` | decoding | `decode.py` |\n") == {"vtools/data": {"decode.py"}}
