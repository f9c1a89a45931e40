"""Training curves: a picture of runs once they have ended (TensorBoard's scalars, while a run goes, are a
tracker's: vtools/observe/tensorboard_tracker.py).

``python -m vtools plot RUN [RUN ...]`` draws loss, top-1 and lr against epoch for one or several runs from
their ``summary.csv`` files into a PNG; train.py draws ``<run>/curves.png`` when it ends. matplotlib is a core
requirement.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from vtools.errors import UsageError
from vtools.evaluation.best_epoch import best_epoch_of, higher_is_better
from vtools.observe.figures import pyplot, save_png
from vtools.results import read_number_table


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
