"""Whether training waited for data, and what to change on this host when it did.

Each epoch measures the share of its wall time the training loop spent
waiting for the next batch (``data_wait`` in the epoch line and summary.csv).
Above ``THRESHOLD`` the run says so once, naming the fix that fits this host:
more loader workers while the cpu budget has cores to give them, images
stored pre-resized (the shards converter's ``--max-side``) when every epoch
decodes full-size files, and a faster store. The end of the run repeats it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from vtools.runtime.cpu_budget import MAX_WORKERS, CpuBudget

THRESHOLD = 0.25  # a quarter of the epoch with the device idle: the loader is the bottleneck


@dataclass(frozen=True)
class LoaderSetting:
    """What the advice depends on: the budget, whether --workers was given, the data, the input size."""

    budget: CpuBudget
    workers_given: bool
    from_files: bool  # decoded from image files on every epoch (a folder), not pre-resized shards
    data_path: str
    img_size: int
    sample_files: tuple[str, ...] = ()  # a few of the training images, to see whether resizing would pay


def typical_side(files: tuple[str, ...]) -> int:
    """The median longer side of ``files`` (headers only); 0 when none can be read."""
    from PIL import Image

    sides = []
    for file in files:
        try:
            with Image.open(file) as image:
                sides.append(max(image.size))
        except OSError:
            continue
    return sorted(sides)[len(sides) // 2] if sides else 0


def data_wait_fixes(setting: LoaderSetting) -> list[str]:
    """The concrete changes for this host, most effective first."""
    budget, fixes = setting.budget, []
    spare = budget.cores - 1 - budget.workers  # one core stays with the main process
    if spare > 0 and budget.workers < 2 * MAX_WORKERS:
        more = min(budget.workers + spare, 2 * MAX_WORKERS)
        why = "" if setting.workers_given else f" (the cpu budget chose {budget.workers} for this device)"
        fixes.append(f"more loader workers: --workers {more} of this process's {budget.cores} cores{why}")
    side = max(2 * setting.img_size, 64)
    if setting.from_files and typical_side(setting.sample_files) > side:
        out = setting.data_path.rstrip("/") + "-wds"
        fixes.append(
            f"decode less: store the images pre-resized, `python -m vtools shards {setting.data_path} {out} "
            f"--max-side {side}`, then train with --dataset wds/{Path(out).name} --data-dir {out}"
        )
    fixes.append("read faster: put the data on a local SSD or in /dev/shm rather than a network filesystem")
    return fixes


class DataWaitVerdict:
    """Says once when an epoch waited for data beyond ``threshold``; summarises the run at its end."""

    def __init__(self, setting: LoaderSetting, threshold: float = THRESHOLD) -> None:
        self.setting = setting
        self.threshold = threshold
        self.slow_epochs: list[tuple[int, float]] = []

    def epoch(self, epoch: int, fraction: float) -> str | None:
        """The message for the first epoch over the threshold; None otherwise."""
        if fraction <= self.threshold:
            return None
        self.slow_epochs.append((epoch, fraction))
        if len(self.slow_epochs) > 1:
            return None
        return (
            f"data wait: epoch {epoch} spent {fraction:.0%} of its time waiting for the next batch (over "
            f"{self.threshold:.0%}): the loader, not the device, sets the pace. Try: " + "; ".join(self.fixes())
        )

    def fixes(self) -> list[str]:
        return data_wait_fixes(self.setting)

    def summary(self) -> str | None:
        """The end-of-run reminder, when any epoch waited too long."""
        if not self.slow_epochs:
            return None
        worst = max(fraction for _, fraction in self.slow_epochs)
        return (
            f"data wait over {self.threshold:.0%} in {len(self.slow_epochs)} epoch(s) (up to {worst:.0%}): "
            + "; ".join(self.fixes())
        )
