"""What a training run writes into its folder besides checkpoints: its options, summary.csv, the best
epoch's class report and the best weights as a model folder.

Every write is announced to the run's :class:`FolderClaim` first, so the folder's ledger names exactly
the files this run wrote (a resume into the folder, and the run's last line, read it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from vtools.atomic import atomic_write_text
from vtools.data.readers.registry import Source
from vtools.errors import UsageError
from vtools.evaluation.class_report import build_report
from vtools.evaluation.loops import EvalResult
from vtools.evaluation.multilabel_eval import write_multilabel_report
from vtools.evaluation.multilabel_metrics import MultiLabelReport
from vtools.evaluation.predictions import Predictions
from vtools.evaluation.report_files import write_report
from vtools.models.folder import export_model_folder
from vtools.models.weights import read_state_dict
from vtools.results import write_rows
from vtools.train.checkpoint import BEST
from vtools.train.loop import EpochResult
from vtools.train.run_lock import FolderClaim

CONFIG_NAMES = ("config.yaml", "args.yaml")
EVAL_DIR = "eval"  # the best epoch's class report
SUMMARY = "summary.csv"
MODEL_DIR = "model"


@dataclass(frozen=True)
class TrainOutcome:
    """What a training run ended with: its exit code, its folder, the exported best model's folder (None
    where none was written, and on ranks other than 0) and the summary.csv rows its folder holds (empty on
    ranks other than 0)."""

    code: int
    folder: Path
    model_dir: Path | None
    summary: list[dict[str, Any]]


def write_run_config(config_text: str, claim: FolderClaim, say: Callable[[str], None]) -> None:
    """The run's resolved options (``config_text``, the YAML the command made of them) as ``config.yaml``
    (``train.py -c`` on it repeats the run); where a config.yaml that no vtools run wrote is in the way
    (the user's own), as ``args.yaml`` beside it."""
    name = next((name for name in CONFIG_NAMES if claim.owns(name)), None)
    if name is None:
        raise UsageError(
            f"{claim.folder} holds {' and '.join(CONFIG_NAMES)} that no vtools run wrote; give this run "
            "another --experiment (or --output) so they stay as they are"
        )
    if name != CONFIG_NAMES[0]:
        say(
            f"{claim.folder / CONFIG_NAMES[0]} was not written by a vtools run: left as it is; this run's options "
            f"go to {claim.folder / name}"
        )
    path = claim.folder / name
    claim.wrote(path, created=not path.exists())
    atomic_write_text(path, config_text)


def eval_columns(metrics: EvalResult | None, multi_label: bool) -> dict[str, Any]:
    """summary.csv's scores: top-1 and top-5, or for multi-label data mAP (macro, micro) and F1 macro at
    --threshold; empty in an epoch without validation."""
    names = ("map", "map_micro", "f1") if multi_label else ("top1", "top5")
    return {f"eval_{name}": getattr(metrics, name) if metrics is not None else "" for name in names}


def summary_row(
    epoch: int, result: EpochResult, metrics: EvalResult | None, lr: float, multi_label: bool = False
) -> dict[str, Any]:
    """One row of summary.csv; the eval columns stay empty in epochs that --val-interval skips. Speed and
    data wait are this process's measurement (a resumed epoch's: its resumed part's), empty where it
    trained none of the epoch (stopped after the epoch's last step, resumed for its validation).
    ``train_samples`` counts the epoch's samples over every process, those trained before a resume too."""
    evaluated, timed = metrics is not None, result.steps > 0
    return {
        "epoch": epoch,
        "train_loss": result.loss,
        "eval_loss": metrics.loss if evaluated else "",
        **eval_columns(metrics, multi_label),
        "lr": lr,
        "img_per_sec": round(result.images_per_second, 2) if timed else "",
        "epoch_seconds": round(result.seconds, 2) if timed else "",
        "data_wait": round(result.data_wait, 4) if timed else "",
        "skipped_updates": result.skipped_updates,
        "eval_samples": metrics.count if evaluated else "",
        "train_samples": result.epoch_samples,
    }


def write_summary(claim: FolderClaim, rows: list[dict[str, Any]]) -> None:
    """summary.csv with every epoch's row so far (the earlier processes' of a resumed run included)."""
    path = claim.folder / SUMMARY
    claim.wrote(path, created=not path.exists())
    write_rows(path, rows, "csv")


def output_names(classes: list[str], num_classes: int) -> list[str]:
    """A name for every output: the data's class names, then the index of any output beyond them
    (--num-classes above the data's class count)."""
    return classes + [str(index) for index in range(len(classes), num_classes)]


def write_eval_report(
    claim: FolderClaim, predictions: Predictions | MultiLabelReport, classes: list[str], source: Source, epoch: int
) -> None:
    """The best epoch's class report in ``<run>/eval`` (tables now; pictures when the run ends); a
    multi-label run's per-class AP, precision, recall and F1."""
    folder = claim.folder / EVAL_DIR
    claim.wrote(folder, created=not folder.exists())
    if isinstance(predictions, MultiLabelReport):
        wrote = lambda path: claim.wrote(path, created=not path.exists())  # noqa: E731
        write_multilabel_report(folder, predictions, {"epoch": epoch}, before_write=wrote)
        return
    report = build_report(predictions, classes, source.sample_names(), about={"epoch": epoch})
    write_report(folder, report, before_write=lambda path: claim.wrote(path, created=not path.exists()))


def export_best(
    model: torch.nn.Module,
    out_dir: Path,
    classes: list[str],
    data_config: dict[str, Any],
    use_ema: bool,
    multi_label: bool = False,
) -> tuple[Path, list[str]]:
    """The best epoch's weights (the EMA's when EMA was validated) loaded into ``model``, a freshly built
    copy of the run's architecture, and exported as ``<run>/model`` (marked multi-label when it is);
    returns the folder and the files in it this run did not write."""
    model.load_state_dict(read_state_dict(out_dir / BEST, use_ema=use_ema))
    return export_model_folder(model, out_dir / MODEL_DIR, classes, data_config, multi_label)
