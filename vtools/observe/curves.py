"""Training curves: TensorBoard scalars while a run goes, and a picture of runs once they have ended.

``--log-tensorboard`` writes, into ``<run>/tensorboard``, one point per epoch
with the values of that epoch's ``summary.csv`` row (train/eval loss, top-1,
top-5, lr, img/s, data wait) and one per log step (loss over the log window,
lr, img/s, data wait). ``python -m vtools plot RUN [RUN ...]`` draws loss, top-1 and lr
against epoch for one or several runs from their ``summary.csv`` files into a
PNG; train.py draws ``<run>/curves.png`` when it ends.

tensorboard is optional (requirements-deploy.txt); matplotlib is a core requirement.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vtools.errors import UsageError
from vtools.evaluation.best_epoch import best_epoch_of, higher_is_better
from vtools.observe.figures import pyplot, save_png
from vtools.observe.tracking import step_metrics
from vtools.optional import TRACK, optional_module
from vtools.results import read_number_table
from vtools.train.loop import LogPoint

EPOCH_SCALARS = {
    "train_loss": "train/loss",
    "eval_loss": "eval/loss",
    "eval_top1": "eval/top1",
    "eval_top5": "eval/top5",
    "eval_map": "eval/map",
    "eval_map_micro": "eval/map_micro",
    "eval_f1": "eval/f1",
    "lr": "lr",
    "img_per_sec": "train/img_per_sec",
    "data_wait": "train/data_wait",
}


class ScalarLog:
    """TensorBoard event files for one run (rank 0), or nothing when not asked for."""

    def __init__(self, folder: Path | None) -> None:
        self.writer = None
        if folder is not None:
            optional_module("tensorboard", "--log-tensorboard", TRACK)
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(folder))

    def step(self, point: LogPoint) -> None:
        """A log step's figures at its update count, named as W&B and MLflow name them."""
        if self.writer is not None:
            for tag, value in step_metrics(point).items():
                self.writer.add_scalar(tag, value, point.num_updates)

    def epoch(self, row: dict[str, Any]) -> None:
        """The epoch's summary.csv row (eval values are empty in epochs without validation)."""
        if self.writer is not None:
            for key, tag in EPOCH_SCALARS.items():
                if row.get(key, "") != "":
                    self.writer.add_scalar(tag, float(row[key]), int(row["epoch"]))
            self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def read_summary_rows(run: Path) -> list[dict[str, str]]:
    path = run / "summary.csv" if run.is_dir() else run
    if not path.is_file():
        raise UsageError(f"{run}: no summary.csv (give a run folder of train.py, or its summary.csv)")
    rows = read_number_table(path, first="epoch")
    if not rows or "epoch" not in rows[0]:
        raise UsageError(f"{path}: not a train.py summary (no epoch rows)")
    return rows


def _series(rows: list[dict[str, str]], key: str) -> tuple[list[int], list[float]]:
    points = [(int(r["epoch"]), float(r[key])) for r in rows if r.get(key, "") not in ("", None)]
    return [p[0] for p in points], [p[1] for p in points]


def best_epoch(run: Path, rows: list[dict[str, str]]) -> int | None:
    """The epoch the run chose as best: by its config's --eval-metric (top1 unless it says otherwise),
    the first epoch that reached the best value, as the checkpoint manager keeps it."""
    metric = "top1"
    config = (run if run.is_dir() else run.parent) / "config.yaml"
    if config.is_file():
        import yaml

        try:
            metric = str((yaml.safe_load(config.read_text(encoding="utf-8")) or {}).get("eval_metric", metric))
        except yaml.YAMLError:
            pass
    epochs, values = _series(rows, f"eval_{metric}")
    return best_epoch_of(epochs, values, higher_is_better(metric))


SCORES = {  # summary.csv's score columns, multi-label or not: (column, label) for the main and second score
    False: (("eval_top1", "top-1"), ("eval_top5", "top-5")),
    True: (("eval_map", "mAP"), ("eval_map_micro", "mAP micro")),
}


def multi_label_rows(rows: list[dict[str, str]]) -> bool:
    """Whether summary.csv's rows are a multi-label run's (mAP columns instead of top-k)."""
    return bool(rows) and "eval_map" in rows[0]


def plot_runs(runs: Sequence[Path], out: Path) -> Path:
    """Loss, top-1 and top-5, and lr against epoch for each run, side by side, with each run's best epoch
    marked, as a PNG written atomically."""
    plt = pyplot("drawing curves")
    from matplotlib.ticker import MaxNLocator

    figure, (loss_ax, top_ax, lr_ax) = plt.subplots(1, 3, figsize=(13, 3.8))
    multi_label_seen = False
    for run in runs:
        rows = read_summary_rows(run)
        name = (run if run.is_dir() else run.parent).name
        (line,) = loss_ax.plot(*_series(rows, "train_loss"), label=f"{name} train")
        colour = line.get_color()
        loss_ax.plot(*_series(rows, "eval_loss"), linestyle="--", color=colour, label=f"{name} eval")
        multi_label_seen = multi_label_seen or multi_label_rows(rows)
        (main, main_label), (second, second_label) = SCORES[multi_label_rows(rows)]
        top_ax.plot(*_series(rows, main), marker=".", color=colour, label=f"{name} {main_label}")
        top_ax.plot(*_series(rows, second), linestyle=":", color=colour, label=f"{name} {second_label}")
        lr_ax.plot(*_series(rows, "lr"), color=colour, label=name)
        best = best_epoch(run, rows)
        if best is not None:
            epochs, top1 = _series(rows, main)
            for axis in (loss_ax, top_ax, lr_ax):
                axis.axvline(best, color=colour, linestyle=":", linewidth=0.8, alpha=0.7)
            if best in epochs:
                value = top1[epochs.index(best)]
                top_ax.plot([best], [value], marker="*", markersize=12, color=colour, linestyle="none",
                            label=f"{name} best: epoch {best}, {main_label} {value:.2f}")  # fmt: skip
    scores_title = "eval mAP, macro and micro (%)" if multi_label_seen else "eval top-1 and top-5 (%)"
    for axis, title in ((loss_ax, "loss"), (top_ax, scores_title), (lr_ax, "learning rate")):
        axis.set_title(title)
        axis.set_xlabel("epoch")
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
    figure.tight_layout()
    return save_png(figure, out)
