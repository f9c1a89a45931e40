"""Setups for ranges_and_guards.yaml: run files as a user edits them, and a run folder that is not the
command's own."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.conftest import fashion_subset, run_script, train_args

HAND_EDITED_ROW = "0,abc,def,\n"  # what the probe typed into summary.csv


def nested_opt_kwargs(tmp: Path) -> None:
    """An optimizer keyword whose value is a mapping: SGD's constructor failed on it with a TypeError."""
    (tmp / "run.yaml").write_text("opt: sgd\nepochs: 1\nopt-kwargs: {a: {b: 1}}\n", encoding="utf-8")


def merge_key_yaml(tmp: Path) -> None:
    """A merge key (`<<: *step`) that PyYAML's safe loader reads; what it merges is out of range, so the run
    stops on the merged value, which proves it was read."""
    (tmp / "run.yaml").write_text(
        "model-kwargs: &step {}\nopt-kwargs:\n  <<: *step\n<<: {sched: step, decay-epochs: 0}\nepochs: 1\n",
        encoding="utf-8",
    )


def colon_without_space_yaml(tmp: Path) -> None:
    """``lr:0.1`` on line 2: PyYAML notices it at line 3."""
    (tmp / "run.yaml").write_text("epochs: 1\nlr:0.1\nopt: sgd\n", encoding="utf-8")


def hand_edited_summary(tmp: Path) -> None:
    """A run folder's summary.csv with a row typed by hand below the one train.py wrote."""
    run = tmp / "run"
    run.mkdir()
    (run / "summary.csv").write_text(
        "epoch,train_loss,eval_loss,eval_top1,lr\n0,1.5,1.2,40.0,0.01\n" + HAND_EDITED_ROW, encoding="utf-8"
    )


def run_folder(tmp: Path) -> None:
    """A run folder as train.py leaves it: its ledger (pid, then the files it wrote) and those files."""
    run = tmp / "runs" / "a"
    run.mkdir(parents=True)
    (run / ".vtools-run.lock").write_text("1\nsummary.csv\n", encoding="utf-8")
    (run / "summary.csv").write_text("epoch,train_loss\n0,1.5\n", encoding="utf-8")


def trained_run_with_hand_edited_summary(tmp: Path) -> None:
    """One epoch trained on a few images, then a row typed by hand into its summary.csv."""
    data = fashion_subset(tmp / "data", 8, 4)
    # the case resumes with the same flags (train_args' own), but for --epochs, which a resume may change
    proc = run_script(train_args(data, tmp / "runs", "a", "--epochs", "1", "--batch-size", "8"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    with (tmp / "runs" / "a" / "summary.csv").open("a", encoding="utf-8") as summary:
        summary.write(HAND_EDITED_ROW)


def threads_help_counts_busy_cores(tmp: Path, proc: subprocess.CompletedProcess) -> None:
    """--threads' default, as the help words it (argparse wraps it), is what a busy host gets: the cores
    less those other processes keep busy, not all of them."""
    text = " ".join(proc.stdout.split())
    assert "the cores this process may use less those other processes keep busy as it starts" in text
    assert "all its cores" not in text
