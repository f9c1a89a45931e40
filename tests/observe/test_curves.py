"""TensorBoard scalars equal summary.csv (read back with tensorboard's own reader); plots are drawn."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from PIL import Image

from tests.conftest import run_script, summary, train_args

pytestmark = pytest.mark.cpu_only(
    reason="logging and drawing are host-side; device training: tests/scripts/test_train.py"
)


@pytest.fixture(scope="module")
def two_runs(fashion4: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("curves")
    for name, lr in (("slow", "0.005"), ("fast", "0.02")):
        proc = run_script(
            train_args(
                fashion4,
                out,
                name,
                "--device",
                "cpu",
                "--epochs",
                "3",
                "--lr",
                lr,
                "--log-interval",
                "2",
                "--log-tensorboard",
            )
        )
        assert proc.returncode == 0, proc.stderr
        assert f"curves: {out / name / 'curves.png'}" in proc.stdout
        (out / f"{name}.log").write_text(proc.stdout)  # what a batch job's log file holds
    return out


def test_the_log_file_a_person_reads(two_runs: Path) -> None:
    """Not a terminal: a line per log step (the 12 of test_tensorboard_log_step_scalars) with the run's ETA,
    epoch lines with data wait and duration, and a last line with the total time and what was written."""
    log = (two_runs / "slow.log").read_text().splitlines()
    steps = [line for line in log if re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d epoch \d \(\d of 3\) step", line)]
    assert len(steps) == 12 and all(" ETA " in line and " img/s " in line for line in steps)
    epochs = [line for line in log if line.startswith("epoch ")]
    assert len(epochs) == 3 and all(re.search(r"data wait \d+%  \d+\.\d s", line) for line in epochs)
    finished = next(line for line in log if line.startswith("finished in "))
    assert f"wrote to {two_runs / 'slow'}: model/" in finished and "eval/ (class report)" in finished


def test_curves_and_class_report_mark_the_runs_best_epoch(two_runs: Path) -> None:
    """The epoch the curves star is the one train.py called best, and eval/ holds that epoch's report."""
    from vtools.observe.curves import best_epoch, read_summary_rows

    run = two_runs / "slow"
    said = re.search(r"best top1 ([\d.]+) at epoch (\d+)", (two_runs / "slow.log").read_text())
    rows = read_summary_rows(run)
    assert best_epoch(run, rows) == int(said.group(2))
    overall = summary_of(run / "eval" / "overall.csv")
    assert int(overall["epoch"]) == int(said.group(2)) and float(overall["top1"]) == pytest.approx(
        float(said.group(1)), abs=0.005
    )  # the log rounds to 0.01


def summary_of(path: Path) -> dict[str, str]:
    import csv

    with path.open(newline="") as handle:
        return next(csv.DictReader(handle))


def _scalars(run: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_tensorboard_epoch_scalars_equal_the_summary(two_runs: Path) -> None:
    run = two_runs / "slow"
    scalars = _scalars(run)
    rows = summary(run)
    for column, tag in (
        ("train_loss", "train/loss"),
        ("eval_loss", "eval/loss"),
        ("eval_top1", "eval/top1"),
        ("eval_top5", "eval/top5"),
        ("lr", "lr"),
        ("img_per_sec", "train/img_per_sec"),
        ("data_wait", "train/data_wait"),
    ):
        assert [step for step, _ in scalars[tag]] == [int(r["epoch"]) for r in rows], tag
        for (_, value), row in zip(scalars[tag], rows):
            assert value == pytest.approx(float(row[column]), rel=1e-6, abs=1e-9), (tag, row["epoch"])


def test_tensorboard_log_step_scalars(two_runs: Path) -> None:
    """One point per log step (every 2 updates, and the epoch's last): 240 images / 32 = 7 updates."""
    scalars = _scalars(two_runs / "slow")
    steps = [step for step, _ in scalars["step/loss"]]
    assert steps == [2, 4, 6, 7, 9, 11, 13, 14, 16, 18, 20, 21]
    assert [step for step, _ in scalars["step/lr"]] == steps
    assert all(value > 0 for _, value in scalars["step/img_per_sec"])


def test_plot_two_runs(two_runs: Path, tmp_path: Path) -> None:
    out = tmp_path / "both.png"
    proc = run_script(
        ["-m", "vtools", "plot", str(two_runs / "slow"), str(two_runs / "fast" / "summary.csv"), "-o", str(out)]
    )
    assert proc.returncode == 0, proc.stderr
    with Image.open(out) as picture:
        assert picture.format == "PNG" and picture.width > 1000
    with Image.open(two_runs / "slow" / "curves.png") as picture:
        assert picture.format == "PNG"


def test_best_epoch_follows_the_runs_eval_metric(tmp_path: Path) -> None:
    """top1 by default (the first epoch reaching the highest), the lowest loss when the run chose loss."""
    from vtools.observe.curves import best_epoch

    rows = [
        {"epoch": "0", "eval_top1": "50", "eval_loss": "0.9"},
        {"epoch": "1", "eval_top1": "70", "eval_loss": "0.5"},
        {"epoch": "2", "eval_top1": "", "eval_loss": ""},  # not validated
        {"epoch": "3", "eval_top1": "70", "eval_loss": "0.4"},
    ]
    assert best_epoch(tmp_path, rows) == 1
    (tmp_path / "config.yaml").write_text("eval_metric: loss\n")
    assert best_epoch(tmp_path, rows) == 3


def test_vtools_plot_refuses_bad_arguments_before_loading_torch_or_matplotlib() -> None:
    """A usage error is said as soon as the command line is read (it took 8.5 s when it came after torch)."""
    code = (
        "import sys\nfrom vtools.cli.runner import command_main\nfrom vtools.errors import UsageError\n"
        "try:\n    command_main('plot')([])\nexcept UsageError as refused:\n    print(refused)\n"
        "print(sorted(name for name in ('torch', 'matplotlib') if name in sys.modules))\n"
    )
    proc = run_script(["-c", code])
    assert proc.stdout.splitlines() == ["the following arguments are required: RUN", "[]"], proc.stderr
