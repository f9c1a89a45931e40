"""How the cost of the class-folder reader grows with the set: the bench's ``scale`` task.

For each tree size (``--scale-sizes``; synthetic trees of tiny PNGs, benchmarks/file_tree.py, kept in
``--scale-trees``), vtools' folder reader (``open_source``) and timm's ``ImageDataset`` take turns, each
in a fresh process (benchmarks/reader_cost.py): scan seconds, the index's resident memory, a loader
worker's private memory growth over one labels-only epoch, and (a second process) the Python heap
the index holds. Then the scripts users run: ``train.py`` to its first training step and
``validate.py`` to its first progress line on the tree, in wall seconds, the main process's cpu
seconds and its resident memory at that moment, each minus the same on a 10-file tree run in turn
with it (what the set adds). timm's reference for those is its
reader alone (its scan and index), as timm's own scripts are not installed here.

Rows (one per size and reader) go to the console, to ``scale.csv`` and to ``scale.png`` (scan time,
index memory and worker growth against the number of files) in ``--scale-dir``; vtools' rows carry
the ratios to timm.
"""

from __future__ import annotations

import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.file_tree import ensure_tree
from benchmarks.options import BenchOptions
from benchmarks.reader_cost import READERS

# what each script prints once its first batch is done (log lines, as stdout is a pipe here)
FIRST_BATCH = {
    "train": re.compile(r" step 1/\d+ loss "),
    "validate": re.compile(r": \[0/\d+\] top1 "),
}
SMALL_TREE = 10  # the files of the tree whose figures are subtracted: what any set costs
SCRIPT_BATCH = 8  # the scripts' batch size: at most the small tree's files
CLASSES_OUT = 1000  # the model's outputs on every tree, so that only the set differs
SCRIPT_TIMEOUT_S = 1800.0

COLUMNS = [
    "task",
    "mode",
    "files",
    "classes",
    "scan_s",
    "index_mib",
    "heap_mib",
    "worker_growth_mib",
    "train_first_s",
    "train_first_cpu_s",
    "train_first_mib",
    "validate_first_s",
    "validate_first_cpu_s",
    "validate_first_mib",
    "scan_vs_timm",
    "index_vs_timm",
    "worker_vs_timm",
    "train_s_vs_timm_scan",
    "train_mib_vs_timm_index",
    "validate_s_vs_timm_scan",
    "validate_mib_vs_timm_index",
]


def parse_sizes(text: str) -> list[int]:
    """``--scale-sizes``: comma-separated file counts (``_`` allowed as in 300_000), each at least 1."""
    from vtools.errors import UsageError

    try:
        sizes = [int(part.strip().replace("_", "")) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UsageError(f"--scale-sizes {text}: give file counts separated by commas, e.g. 10000,100000") from None
    if not sizes or min(sizes) < 1:
        raise UsageError(f"--scale-sizes {text}: give file counts of 1 or more, e.g. 10000,100000")
    return sizes


def measure_scale(options: BenchOptions, say: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Every size's rows (see the module docstring); ``say`` gets a line per measurement as it ends."""
    say = say or (lambda line: print(line, file=sys.stderr, flush=True))
    cache = Path(options.scale_trees)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="vtools-bench-scale-") as work:
        checkpoint = _random_checkpoint(Path(work))
        scripts = _script_commands(options, checkpoint, Path(work))
        small = ensure_tree(cache, SMALL_TREE, SMALL_TREE)
        for name, command in scripts.items():  # untimed: the first launch reads the libraries from disk
            first_batch(command(small), FIRST_BATCH[name])
        for files in parse_sizes(options.scale_sizes):
            started = time.perf_counter()
            tree = ensure_tree(cache, files)
            say(f"scale     tree of {files} files ready in {time.perf_counter() - started:.1f} s: {tree}")
            rows += _size_rows(options, tree, small, scripts, say)
    add_scale_ratios(rows)
    return rows


def _size_rows(
    options: BenchOptions,
    tree: Path,
    small: Path,
    scripts: dict[str, Callable[[Path], list[str]]],
    say: Callable[[str], None],
) -> list[dict[str, Any]]:
    """One size: the readers alternated ``--repeats`` times (medians), their heaps, and each script on the
    10-file tree and on this one in turn (first one, then the other), the difference kept."""
    runs: dict[str, list[dict[str, Any]]] = {reader: [] for reader in READERS}
    script_runs: dict[str, list[FirstBatch]] = {name: [] for name in scripts}
    for repeat in range(options.repeats):
        for reader in READERS:
            runs[reader].append(reader_figures(reader, tree))
            say(f"scale     {reader:8s} {json.dumps(runs[reader][-1])}")
        for name, command in scripts.items():
            trees = (small, tree) if repeat % 2 == 0 else (tree, small)  # the order alternates too
            timed = {folder: first_batch(command(folder), FIRST_BATCH[name]) for folder in trees}
            script_runs[name].append(timed[tree].minus(timed[small]))
            say(
                f"scale     {name} to its first batch: {timed[tree]}; added over the {SMALL_TREE}-file tree: "
                f"{script_runs[name][-1]}"
            )
    classes = len(os.listdir(tree / "train"))
    rows = []
    for reader in READERS:
        heap = reader_figures(reader, tree, heap=True)
        row: dict[str, Any] = {"task": "scale", "mode": reader, "files": runs[reader][0]["files"], "classes": classes}
        for key in ("scan_s", "index_mib", "worker_growth_mib"):
            row[key] = round(statistics.median(run[key] for run in runs[reader]), 3)
        row["scan_runs_s"] = " ".join(f"{run['scan_s']:.3f}" for run in runs[reader])
        row["heap_mib"] = heap["heap_mib"]
        if reader == "vtools":  # the scripts are vtools'; timm's reference is its reader alone
            for name, added in script_runs.items():
                row[f"{name}_first_s"] = round(statistics.median(run.seconds for run in added), 2)
                row[f"{name}_first_cpu_s"] = round(statistics.median(run.cpu_seconds for run in added), 2)
                row[f"{name}_first_mib"] = round(statistics.median(run.mib for run in added), 1)
        rows.append(row)
    return rows


def reader_figures(reader: str, tree: Path, heap: bool = False) -> dict[str, Any]:
    """One reader's figures over ``tree``, from a fresh process (benchmarks/reader_cost.py)."""
    command = [sys.executable, "-m", "benchmarks.reader_cost", reader, str(tree), *(["--heap"] if heap else [])]
    proc = subprocess.run(command, capture_output=True, text=True)
    if proc.returncode != 0:
        from vtools.errors import UsageError

        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise UsageError(f"benchmark scale/{reader} on {tree} failed: {last}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


@dataclass(frozen=True)
class FirstBatch:
    """A script's way to its first batch: wall seconds from launch, the cpu seconds its main process
    spent (less disturbed by other work on a shared machine than the wall time), resident MiB then."""

    seconds: float
    cpu_seconds: float
    mib: float

    def minus(self, other: FirstBatch) -> FirstBatch:
        return FirstBatch(self.seconds - other.seconds, self.cpu_seconds - other.cpu_seconds, self.mib - other.mib)

    def __str__(self) -> str:
        return f"{self.seconds:.1f} s ({self.cpu_seconds:.1f} s cpu), {self.mib:.0f} MiB"


def first_batch(command: list[str], done: re.Pattern[str]) -> FirstBatch:
    """What ``command`` took to print the first line of its output matching ``done`` (its first batch
    done); the process and its loader workers are killed there."""
    from vtools.errors import UsageError

    environment = {**os.environ, "PYTHONUNBUFFERED": "1"}
    start = time.perf_counter()
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=environment, start_new_session=True
    )
    seen: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if done.search(line):
                seconds = time.perf_counter() - start
                return FirstBatch(seconds, _cpu_seconds(proc.pid), _resident_mib(proc.pid))
            seen.append(line.rstrip())
            if time.perf_counter() - start > SCRIPT_TIMEOUT_S:
                break
        last = next((line for line in reversed(seen) if line.strip()), "no output")
        raise UsageError(f"benchmark scale: {' '.join(command[1:4])} ended before its first batch: {last}")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # its own session: the script and its workers
        proc.wait()
        proc.stdout.close()
        _wait_gone(proc.pid)


def _wait_gone(group: int, limit_s: float = 30.0) -> None:
    """Wait until every process of ``group`` has exited, so that the next measurement does not start
    while the kernel still tears down this one's memory (the loader workers exit after the script)."""
    deadline = time.perf_counter() + limit_s
    while time.perf_counter() < deadline:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)


def _cpu_seconds(pid: int) -> float:
    """User + system cpu seconds of process ``pid`` so far (its threads included, its children not)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _resident_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status", encoding="ascii") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _random_checkpoint(folder: Path) -> str:
    """Random weights for validate.py (it loads weights; the hub cannot be assumed reachable)."""
    import timm
    import torch

    path = folder / "test_resnet.pth"
    torch.save(timm.create_model("test_resnet", num_classes=CLASSES_OUT).state_dict(), path)
    return str(path)


def _script_commands(options: BenchOptions, checkpoint: str, work: Path) -> dict[str, Callable[[Path], list[str]]]:
    """train.py and validate.py on a tree: a tiny model at 32 px, two loader workers, a log line after the
    first batch; batches of 8, which the 10-file tree fills too (train.py shrinks a batch larger than
    the set), so the first batch is the same work on every tree."""
    common = ["--model", "test_resnet", "--img-size", "32", "--batch-size", str(SCRIPT_BATCH), "-j", "2"]
    common += ["--num-classes", str(CLASSES_OUT), "--device", options.device]
    vtools = [sys.executable, "-m", "vtools"]

    def train(tree: Path) -> list[str]:
        run = ["--epochs", "1", "--warmup-epochs", "0", "--log-interval", "1", "--output", str(work / "runs")]
        return [*vtools, "train", str(tree), *common, *run]

    def validate(tree: Path) -> list[str]:
        run = ["--split", "train", "--checkpoint", checkpoint, "--log-freq", "1"]
        return [*vtools, "validate", str(tree), *common, *run]

    return {"train": train, "validate": validate}


def add_scale_ratios(rows: list[dict[str, Any]]) -> None:
    """vtools' figures over timm's on the same size (below 1: vtools costs less): scan, index and worker
    growth against timm's same figure; the scripts' added time and memory against timm's scan and index
    (timm's reader alone, the least any timm script adds)."""
    timm = {row["files"]: row for row in rows if row["mode"] == "timm"}
    pairs = {
        "scan_vs_timm": ("scan_s", "scan_s"),
        "index_vs_timm": ("index_mib", "index_mib"),
        "worker_vs_timm": ("worker_growth_mib", "worker_growth_mib"),
        "train_s_vs_timm_scan": ("train_first_s", "scan_s"),
        "train_mib_vs_timm_index": ("train_first_mib", "index_mib"),
        "validate_s_vs_timm_scan": ("validate_first_s", "scan_s"),
        "validate_mib_vs_timm_index": ("validate_first_mib", "index_mib"),
    }
    for row in rows:
        reference = timm.get(row["files"])
        if row["mode"] != "vtools" or reference is None:
            continue
        for ratio, (ours, theirs) in pairs.items():
            if row.get(ours) is not None and reference.get(theirs):
                row[ratio] = round(row[ours] / reference[theirs], 3)


def plot_scale(rows: list[dict[str, Any]], path: Path) -> Path:
    """Scan seconds, index MiB and worker growth against the number of files (log x), a line per reader."""
    from vtools.observe.figures import pyplot, save_png

    plt = pyplot("the scale task's plot")
    panels = {
        "scan_s": "scan (build the sample list), s",
        "index_mib": "index memory (RSS added), MiB",
        "worker_growth_mib": "loader worker's private growth, MiB",
    }
    figure, axes = plt.subplots(1, len(panels), figsize=(14, 4))
    for reader in READERS:
        mine = sorted((row for row in rows if row["mode"] == reader), key=lambda row: row["files"])
        files = [row["files"] for row in mine]
        for axis, key in zip(axes, panels):
            axis.plot(files, [row[key] for row in mine], marker="o", label=reader)
    for axis, title in zip(axes, panels.values()):
        axis.set_xscale("log")
        axis.set_xlabel("files")
        axis.set_title(title)
        axis.grid(True, alpha=0.3)
        axis.legend()
    figure.tight_layout()
    return save_png(figure, path)


def write_scale(rows: list[dict[str, Any]], folder: Path) -> list[Path]:
    """``scale.csv`` and ``scale.png`` in ``folder``."""
    from vtools.results import write_rows

    folder.mkdir(parents=True, exist_ok=True)
    return [write_rows(folder / "scale.csv", rows, "csv"), plot_scale(rows, folder / "scale.png")]
