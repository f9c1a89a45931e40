"""A module's tests are found by its path: ``vtools/<package>/<module>.py`` is tested in
``tests/<package>/test_<module>.py`` (or ``test_<module>_<aspect>.py``), and a module without such a file is
listed below with the reason. Whole-script behaviour lives in ``tests/scripts/``, rules read from the source in
``tests/rules/``, the emulated NPU's self-tests in ``tests/emulator/``, ``tools/``'s in ``tests/tools/``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.cpu_only(reason="reads file names; runs nothing on a device")

NOT_PACKAGE_FOLDERS = {"scripts", "rules", "emulator", "emulated_npu", "tools"}

# modules without a test file of their own, and where their behaviour is tested instead
TESTED_ELSEWHERE = {
    "vtools/__main__.py": "the `vtools` dispatcher: tests/scripts/test_package.py runs the installed command",
    "vtools/atomic.py": "atomic writes: tests/test_outputs.py, tests/scripts/test_run_safety.py (a full disk)",
    "vtools/errors.py": "the error classes: tests/scripts/test_one_line_errors.py is the table of their lines",
    "vtools/optional.py": "two lines of import guarding; every optional-extra test goes through it",
    "vtools/progress.py": "tqdm settings; the scripts' progress lines are checked in tests/scripts/",
    "vtools/run_ledger.py": "the ledger: tests/test_outputs.py (other runs' files), tests/scripts/test_run_safety.py",
    "vtools/run_events.py": "the run's events: tests/observe/test_tracking.py sends them, test_run_trackers.py claims",
    "vtools/runtime/resolve.py": "flags to a runtime: every script test; tests/runtime/test_cpu_budget.py",
    "vtools/runtime/torch_import.py": "the guarded import: tests/observe/test_env_report.py breaks torch for real",
    "vtools/options/values.py": "torch-free flag values: tests/cli/test_runner.py and tests/cli/test_train_flags.py",
    "vtools/cli/benchmark_flags.py": "tests/options/test_benchmark.py, test_shared.py; tests/scripts/test_benchmark.py",
    "vtools/cli/env_flags.py": "a generated parser: tests/options/test_tools.py, test_declared_options.py",
    "vtools/cli/plot_flags.py": "a generated parser: tests/options/test_tools.py, test_declared_options.py",
    "vtools/cli/shards_flags.py": "a generated parser: tests/options/test_tools.py, test_declared_options.py",
    "vtools/cli/compare_flags.py": "a generated parser: tests/options/test_tools.py, test_declared_options.py",
    "vtools/cli/clean_checkpoint_flags.py": "a generated parser: tests/options/test_tools.py, test_declared_options.py",
    "vtools/cli/avg_checkpoints_flags.py": "a generated parser: tests/options/test_tools.py, test_declared_options.py",
    "vtools/cli/export_flags.py": "a generated parser: tests/options/test_tools.py, test_declared_options.py",
    "vtools/cli/bulk_flags.py": "a generated parser: tests/options/test_tools.py, test_declared_options.py",
    "vtools/cli/parity_flags.py": "a generated parser: tests/options/test_tools.py, test_declared_options.py",
    "vtools/cli/infer_flags.py": "inference.py's flags: tests/cli/test_eval_flags.py against timm's objects",
    "vtools/cli/options.py": "the shared flags: tests/cli/test_timm_compat.py compares them with timm's option list",
    "vtools/cli/parser.py": "one-line argparse errors: tests/scripts/test_one_line_errors.py",
    "vtools/cli/validate_flags.py": "validate.py's flags: tests/cli/test_eval_flags.py against timm's objects",
    "vtools/models/activation_memory.py": "tests/data/test_memory_estimate.py measures it with the estimate",
    "vtools/models/create.py": "model creation: every script test builds its model through it",
    "vtools/models/folder.py": "model folders: tests/scripts/test_validate.py and test_inference.py load them",
    "vtools/models/onnx_model.py": "ONNX models: tests/deploy/test_export.py validates and predicts with them",
    "vtools/models/weights.py": "the checkpoint reader: tests/scripts/test_bad_input.py feeds it timm's checkpoints",
    "vtools/data/color_jitter.py": "the device-side jitter: tests/data/test_train_augment.py against timm's",
    "vtools/data/decode.py": "decoding: tests/data/test_train_augment.py and tests/data/test_loaders.py",
    "vtools/data/shard_writer.py": "tests/scripts/test_sources.py writes shards and reads them back",
    "vtools/data/transforms.py": "timm's transforms resolved: tests/data/test_train_augment.py",
    "vtools/data/readers/folder.py": "tests/data/readers/test_registry_labels.py and test_scan.py",
    "vtools/data/readers/torchvision.py": "tests/data/test_datasets.py and tests/scripts/test_sources.py",
    "vtools/evaluation/speed.py": "timed by tests/scripts/test_benchmark.py on cpu and the emulated npu",
    "vtools/runtime/options.py": "a dataclass: tests/options/test_train_job.py fills it",
    "vtools/evaluation/model_flags.py": "timm's evaluation model flags: tests/cli/test_eval_flags.py",
    "vtools/evaluation/predictions.py": "tests/evaluation/test_class_report.py collects them on every device",
    "vtools/evaluation/report_compare.py": "tests/evaluation/test_class_report.py compares two reports",
    "vtools/evaluation/report_files.py": "tests/evaluation/test_class_report.py writes and reads them",
    "vtools/train/assemble.py": "tests/data/test_sampling.py and tests/cli/test_train_flags.py build through it",
    "vtools/train/checkpoint.py": "tests/train/test_resume.py writes, reads and restores checkpoints",
    "vtools/train/run_clock.py": "log lines and ETA: tests/observe/test_data_wait.py",
    "vtools/train/run_files.py": "tests/train/test_run.py (run.py and run_files.py together)",
    "vtools/train/run_lock.py": "run folder locks: tests/scripts/test_run_safety.py",
    "vtools/observe/figures.py": "tests/observe/test_curves.py draws them",
    "vtools/observe/profiling.py": "tests/scripts/test_profile.py",
    "vtools/observe/report_plots.py": "tests/evaluation/test_class_report.py draws them",
    "benchmarks/loader_ceiling.py": "tests/bench/test_measure.py runs every bench task",
    "benchmarks/onepass.py": "tests/bench/test_measure.py runs every bench task",
    "benchmarks/photos.py": "tests/bench/test_measure.py runs every bench task",
    "benchmarks/plain_loop.py": "tests/bench/test_measure.py runs every bench task",
    "vtools/commands/avg_checkpoints.py": "tests/scripts/test_checkpoint_tools.py averages a real run's checkpoints",
    "benchmarks/command.py": "tests/bench/test_measure.py",
    "vtools/commands/benchmark.py": "tests/scripts/test_benchmark.py runs `vtools benchmark` on cpu and the npu",
    "vtools/commands/bulk.py": "tests/scripts/test_bulk.py runs `vtools bulk` over benchmark and validate.py",
    "vtools/commands/clean_checkpoint.py": "tests/scripts/test_checkpoint_tools.py cleans a real run's checkpoint",
    "vtools/commands/compare.py": "tests/evaluation/test_class_report.py runs `vtools compare`",
    "vtools/commands/env.py": "tests/observe/test_env_report.py",
    "vtools/commands/export.py": "tests/deploy/test_export.py",
    "vtools/commands/infer.py": "inference.py: tests/scripts/test_inference.py",
    "vtools/commands/parity.py": "tests/observe/test_parity.py",
    "vtools/commands/plot.py": "tests/observe/test_curves.py",
    "vtools/commands/shards.py": "tests/scripts/test_sources.py",
    "vtools/commands/train.py": "train.py: tests/scripts/test_train.py",
    "vtools/commands/validate.py": "validate.py: tests/scripts/test_validate.py",
}


# the source folders and where their mirrored tests live: benchmarks/ (outside the package) in tests/bench/
TEST_FOLDERS = {"vtools": Path(), "benchmarks": Path("bench")}


def modules(root: Path) -> list[str]:
    return sorted(
        p.relative_to(root).as_posix()
        for source in TEST_FOLDERS
        for p in (root / source).rglob("*.py")
        if p.name != "__init__.py" and (p.name != "__main__.py" or source == "vtools")
    )


def folder_of_tests(module: str) -> Path:
    """Where ``module``'s tests live, relative to tests/: vtools/a/b.py in a/, benchmarks/b.py in bench/."""
    path = Path(module)
    return TEST_FOLDERS[path.parts[0]] / Path(*path.parts[1:-1])


def mirrored_tests(module: str, root: Path) -> list[str]:
    """The mirrored test files of ``vtools/<package>/<module>.py`` (or ``benchmarks/<module>.py``)."""
    path = Path(module)
    folder = root / "tests" / folder_of_tests(module)
    stem = f"test_{path.stem}"
    return sorted(p.name for p in folder.glob(f"{stem}*.py") if p.stem == stem or p.stem.startswith(stem + "_"))


def unmapped(root: Path, reasons: dict[str, str]) -> list[str]:
    """Modules with neither a mirrored test file nor a reason, reasons for modules that have a file or no
    longer exist, and test files in package folders named after no module."""
    found = modules(root)
    problems = [
        f"{m}: no tests/…/test_{Path(m).stem}.py and no reason"
        for m in found
        if not mirrored_tests(m, root) and m not in reasons
    ]
    problems += [
        f"{m}: listed with a reason but it has a test file" for m in reasons if m in found and mirrored_tests(m, root)
    ]
    problems += [f"{m}: listed but not a module" for m in reasons if m not in found]
    stems = {str(folder_of_tests(m) / Path(m).stem) for m in found}
    for test in sorted((root / "tests").rglob("test_*.py")):
        rel = test.relative_to(root / "tests")
        if rel.parts[0] in NOT_PACKAGE_FOLDERS and len(rel.parts) > 1:
            continue
        name = rel.stem[len("test_") :]
        owners = [
            s
            for s in stems
            if Path(s).parent == rel.parent and (name == Path(s).name or name.startswith(Path(s).name + "_"))
        ]
        if not owners:
            problems.append(f"tests/{rel.as_posix()}: named after no module of its folder")
    return problems


def test_every_module_has_its_test_file_or_a_reason() -> None:
    problems = unmapped(REPO, TESTED_ELSEWHERE)
    assert not problems, "\n".join(problems)


def test_the_check_finds_a_module_without_tests(tmp_path: Path) -> None:
    (tmp_path / "vtools" / "train").mkdir(parents=True)
    (tmp_path / "tests" / "train").mkdir(parents=True)
    for name in ("loop.py", "resume.py", "lock.py"):
        (tmp_path / "vtools" / "train" / name).write_text("")
    (tmp_path / "tests" / "train" / "test_loop.py").write_text("")
    (tmp_path / "tests" / "train" / "test_resume_state.py").write_text("")
    (tmp_path / "tests" / "train" / "test_stray.py").write_text("")
    assert unmapped(tmp_path, {"vtools/train/lock.py": "elsewhere"}) == [
        "tests/train/test_stray.py: named after no module of its folder"
    ]
    assert unmapped(tmp_path, {}) == [
        "vtools/train/lock.py: no tests/…/test_lock.py and no reason",
        "tests/train/test_stray.py: named after no module of its folder",
    ]
    assert unmapped(tmp_path, {"vtools/train/loop.py": "x", "vtools/train/lock.py": "y"}) == [
        "vtools/train/loop.py: listed with a reason but it has a test file",
        "tests/train/test_stray.py: named after no module of its folder",
    ]
