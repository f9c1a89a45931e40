"""The scripts' command lines are read before torch: --help, a typo, a bad YAML key and every refusal that
reads only the options answer without importing torch, timm, torchvision or the data libraries; each flag
is added in one place in the source; the flags' torch-free choices name the library's values."""

from __future__ import annotations

import argparse
import ast
import re
from pathlib import Path

import pytest

from tests.conftest import REPO, run_script

pytestmark = pytest.mark.cpu_only(reason="parses command lines and reads source files; runs nothing on a device")

HEAVY = ("torch", "timm", "torchvision", "numpy", "PIL")

# runs an entry point as `python SCRIPT ARGS...` (or `python -m vtools ARGS...`) would, and reports at exit
# which heavy modules were imported; PLANT is code run first (the check's own check plants an import there)
PROBE = """
import atexit, runpy, sys
atexit.register(lambda: print("heavy:", ",".join(m for m in {heavy!r} if m in sys.modules), file=sys.stderr))
{plant}
entry, sys.argv = {entry!r}, {argv!r}
if entry == "vtools":
    runpy.run_module("vtools", run_name="__main__", alter_sys=True)
else:
    runpy.run_path(entry, run_name="__main__")
"""

BAD_KEY_YAML = "model: resnet18\nlerning_rate: 0.1\n"

# (entry point, argv, exit code, a piece of its output)
ANSWERED_BEFORE_TORCH = [
    ("train.py", ["--help"], 0, "usage: train.py"),
    ("validate.py", ["--help"], 0, "usage: validate.py"),
    ("inference.py", ["--help"], 0, "usage: inference.py"),
    ("vtools", ["train", "--help"], 0, "usage: vtools train"),
    ("train.py", ["--lerning-rate", "1"], 2, "did you mean --lr?"),
    ("train.py", ["-c", "{yaml}"], 2, "unknown key 'lerning_rate' (did you mean 'lr'?)"),
    ("train.py", ["--data-dir", "x", "--epoch-repeats", "2"], 2, "--epoch-repeats 2.0: timm repeats"),
    ("train.py", ["--data-dir", "x", "--mixup", "0.2", "-b", "3"], 2, "--batch-size must be even"),
    ("train.py", ["--data-dir", "x", "--model-kwargs", "drop_rate"], 2, "expected KEY=VALUE"),
    ("validate.py", ["x", "--model", "m", "--crop-pct", "50"], 2, "--crop-pct must be above 0"),
    ("validate.py", ["x", "--model", "m", "--report", "r", "--report-worst", "-1"], 2, "--report-worst must be 0"),
    ("inference.py", ["x", "--model", "m", "--topk", "-1"], 2, "--topk must be 0 (every class) or positive"),
    ("inference.py", ["x"], 2, "--model is required"),
]


def probe(entry: str, argv: list[str], plant: str = "") -> tuple[int, str, list[str]]:
    """Exit code, output, and the heavy modules imported by the time the entry point exited."""
    proc = run_script(["-c", PROBE.format(heavy=HEAVY, plant=plant, entry=entry, argv=[entry, *argv])])
    lines = proc.stderr.splitlines()
    report = next(line for line in reversed(lines) if line.startswith("heavy:"))
    imported = [name for name in report.removeprefix("heavy:").strip().split(",") if name]
    return proc.returncode, proc.stdout + "\n".join(line for line in lines if line != report), imported


@pytest.mark.parametrize(
    "entry,argv,code,text", ANSWERED_BEFORE_TORCH, ids=[" ".join([e, *a]) for e, a, _, _ in ANSWERED_BEFORE_TORCH]
)
def test_answered_without_heavy_imports(entry: str, argv: list[str], code: int, text: str, tmp_path: Path) -> None:
    config = tmp_path / "run.yaml"
    config.write_text(BAD_KEY_YAML, encoding="utf-8")
    returncode, output, imported = probe(entry, [arg.format(yaml=config) for arg in argv])
    assert (returncode, imported) == (code, []), output
    assert text in output
    if code:
        assert len(output.strip().splitlines()) == 1, output  # still one line


def test_the_probe_sees_a_heavy_import() -> None:
    """The check above can fail: with torch imported on the way, the probe names it."""
    returncode, _, imported = probe("train.py", ["--help"], plant="import torch")
    assert returncode == 0 and "torch" in imported


# ---------------------------------------------------------------- each flag added once

FLAG = re.compile(r"^--?[A-Za-z][\w-]*$")

# parsers of other programs, whose flags are theirs to name (they reuse vtools/cli/options.py's groups where
# a flag means what it means in the scripts)
OTHER_PROGRAMS = {
    "benchmarks/plain_loop.py": "the plain baseline: a stand-alone loop that shares no vtools code on purpose",
    "vtools/commands/avg_checkpoints.py": "timm's avg_checkpoints.py's options, by timm's names",
    "benchmarks/command.py": "python3 -m benchmarks's own options",
    "vtools/commands/benchmark.py": "timm's benchmark.py's options, by timm's names and defaults",
    "vtools/commands/bulk.py": "timm's bulk_runner.py's options, by timm's names",
    "vtools/commands/clean_checkpoint.py": "timm's clean_checkpoint.py's options, by timm's names",
    "vtools/commands/compare.py": "python -m vtools compare's own options",
    "vtools/commands/env.py": "python -m vtools env's own options",
    "vtools/commands/export.py": "python -m vtools export's own options",
    "vtools/commands/parity.py": "python -m vtools parity's own options",
    "vtools/commands/plot.py": "python -m vtools plot's own options",
    "vtools/commands/shards.py": "python -m vtools shards's own options",
}


def _callee(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def _adds(node: ast.AST) -> bool:
    """A call that adds an argument: add_argument, add_refused, add_no_op (not add_argument_group)."""
    return isinstance(node, ast.Call) and _callee(node).startswith("add") and _callee(node) != "add_argument_group"


def _flags_in(node: ast.AST) -> list[ast.Constant]:
    return [
        n for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str) and FLAG.match(n.value)
    ]


def flag_definitions(source: str, where: str) -> dict[str, list[str]]:
    """Flag -> the places (``where:line``) that add it: a flag string passed to a call that adds arguments,
    or listed in the loop that passes each of its items to one."""
    found: dict[str, list[str]] = {}
    for node in ast.walk(ast.parse(source)):
        if _adds(node):
            constants = [c for arg in node.args if isinstance(arg, ast.Constant) for c in _flags_in(arg)]
        elif isinstance(node, ast.For) and any(_adds(n) for stmt in node.body for n in ast.walk(stmt)):
            constants = _flags_in(node.iter)
        else:
            continue
        for constant in constants:
            found.setdefault(constant.value, []).append(f"{where}:{constant.lineno}")
    return found


def defined_twice(files: dict[str, str]) -> list[str]:
    places: dict[str, list[str]] = {}
    for where, source in files.items():
        for flag, lines in flag_definitions(source, where).items():
            places.setdefault(flag, []).extend(lines)
    return [f"{flag}: {', '.join(lines)}" for flag, lines in sorted(places.items()) if len(lines) > 1]


def test_each_flag_is_added_in_one_place() -> None:
    assert all((REPO / path).is_file() for path in OTHER_PROGRAMS), "a listed program is gone: update the list"
    files = {
        path.relative_to(REPO).as_posix(): path.read_text(encoding="utf-8")
        for path in sorted((REPO / "vtools").rglob("*.py"))
        if path.relative_to(REPO).as_posix() not in OTHER_PROGRAMS
    }
    twice = defined_twice(files)
    assert not twice, "flags added in more than one place (share a function that adds them):\n" + "\n".join(twice)


def test_the_one_place_rule_catches_a_flag_added_twice() -> None:
    planted = {
        "loader.py": 'def add_loader(group):\n    group.add_argument("--on-bad-image", default="error")\n',
        "train.py": 'def add_train(group):\n    add_no_op(group, "-b", "--on-bad-image", reason="")\n',
        "refused.py": 'def add_more(group):\n    for flag in ("--pin-mem", "--naflex-loader"):\n'
        '        add_refused(group, flag, reason="")\n    add_refused(group, "--naflex-loader", reason="")\n',
    }
    assert defined_twice(planted) == [
        "--naflex-loader: refused.py:2, refused.py:4",
        "--on-bad-image: loader.py:2, train.py:2",
    ]
    assert defined_twice({"ok.py": 'def f(p):\n    p.add_argument_group("--x")\n    p.add_argument("--x")\n'}) == []


# ---------------------------------------------------------------- torch-free choices, the library's values


def test_the_flags_choices_are_the_library_values() -> None:
    import torch
    from timm.utils import ParseKwargs

    from vtools.cli.parser import KeyValuePairs
    from vtools.data.decode import ON_BAD_IMAGE
    from vtools.evaluation.class_report import DEFAULT_BINS
    from vtools.evaluation.metrics import METRICS_AVERAGES
    from vtools.models.folder import LABEL_TYPES
    from vtools.options import values as flag_values
    from vtools.runtime.amp import AMP_DTYPES

    assert flag_values.AMP_DTYPE_CHOICES == AMP_DTYPES
    assert flag_values.ON_BAD_IMAGE_CHOICES == ON_BAD_IMAGE
    assert flag_values.METRICS_AVERAGE_CHOICES == METRICS_AVERAGES
    assert flag_values.LABEL_TYPE_CHOICES == LABEL_TYPES
    assert flag_values.CALIBRATION_BINS == DEFAULT_BINS
    assert all(getattr(torch, name).is_floating_point for name in flag_values.MODEL_DTYPES)
    given = ["drop_rate=0.1", "act=gelu", "sizes=[1, 2]", "name=a=b", ""]
    ours, timms = argparse.ArgumentParser(), argparse.ArgumentParser()
    ours.add_argument("--kw", nargs="*", default={}, action=KeyValuePairs)
    timms.add_argument("--kw", nargs="*", default={}, action=ParseKwargs)
    assert ours.parse_args(["--kw", *given]).kw == timms.parse_args(["--kw", *given]).kw
