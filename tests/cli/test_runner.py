"""The scripts' command lines are read before torch: --help, a typo, a bad YAML key and every refusal that
reads only the options answer without importing torch, timm, torchvision or the data libraries; the
flags' torch-free choices name the library's values. (Each flag declared once: tests/rules/test_declared_options.py.)"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from tests.conftest import run_script

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
    # a flag benchmark shares with train.py: its declaration's range, before torch (issue 61's example)
    ("vtools", ["benchmark", "--drop", "1.5"], 2, "--drop must be from 0 up to (not including) 1, got 1.5"),
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
