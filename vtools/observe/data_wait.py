"""Whether training waited for data, and what to change on this host when it did.

Each epoch measures the share of its wall time the training loop spent
waiting for the next batch (``data_wait`` in the epoch line and summary.csv).
Above ``THRESHOLD`` the run says so once, naming the fix that fits this host:
more loader workers while the cpu budget has cores to give them, images
stored pre-resized (the shards converter's ``--max-side``) when every epoch
decodes full-size files, and a faster store where the data is not known to be on a local disk (its
filesystem, from /proc/mounts, is not one of the local kinds). The end of the run repeats it.

An epoch of fewer than ``MIN_STEPS`` batches brings no verdict: its wait is mostly the first batch's, the
workers starting and filling their queues, which no change of store or worker count removes (a 120-image
run from a local disk was told to move its data to an SSD).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from vtools.runtime.cpu_budget import MAX_WORKERS, CpuBudget

THRESHOLD = 0.25  # a quarter of the epoch with the device idle: the loader is the bottleneck
MIN_STEPS = 20  # batches an epoch needs before its data-wait share says something about the loader
MOUNTS = "/proc/mounts"
# filesystems on a disk or in memory of this host; anything else (nfs, cifs, lustre, fuse.*, 9p) may be remote
LOCAL_FILESYSTEMS = frozenset(
    "ext2 ext3 ext4 xfs btrfs zfs bcachefs f2fs jfs reiserfs tmpfs ramfs overlay squashfs erofs vfat exfat "
    "ntfs ntfs3 apfs hfs hfsplus iso9660 udf".split()
)


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


def filesystem_of(path: str, mounts: str | None = None) -> str | None:
    """The type of the filesystem holding ``path`` (the longest mount point above it in ``mounts``, the text
    of /proc/mounts, read when not given); None where that cannot be told (no /proc: not Linux)."""
    if mounts is None:
        try:
            mounts = Path(MOUNTS).read_text(encoding="utf-8", errors="replace")
        except OSError:
            return None
    target = os.path.realpath(path or ".")
    best, kind = "", None
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, fields[2]
    return kind


def on_local_disk(path: str, mounts: str | None = None) -> bool:
    """Whether the data is known to sit on this host's own disk or memory (then a faster store is no advice)."""
    return filesystem_of(path, mounts) in LOCAL_FILESYSTEMS


def data_wait_fixes(setting: LoaderSetting, mounts: str | None = None) -> list[str]:
    """The concrete changes for this host, most effective first; ``mounts`` stands for /proc/mounts."""
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
    if not on_local_disk(setting.data_path, mounts):
        where = filesystem_of(setting.data_path, mounts)
        fixes.append(
            "read faster: put the data on a local SSD or in /dev/shm"
            + (f" (it is on {where}, not a local disk)" if where else " rather than a network filesystem")
        )
    return fixes


class DataWaitVerdict:
    """Says once when an epoch waited for data beyond ``threshold``; summarises the run at its end."""

    def __init__(self, setting: LoaderSetting, threshold: float = THRESHOLD) -> None:
        self.setting = setting
        self.threshold = threshold
        self.slow_epochs: list[tuple[int, float]] = []

    def epoch(self, epoch: int, fraction: float, steps: int = MIN_STEPS) -> str | None:
        """The message for the first epoch over the threshold with ``steps`` batches enough to tell; None
        otherwise."""
        if fraction <= self.threshold or steps < MIN_STEPS:
            return None
        self.slow_epochs.append((epoch, fraction))
        if len(self.slow_epochs) > 1:
            return None
        return (
            f"data wait: epoch {epoch} spent {fraction:.0%} of its time waiting for the next batch (over "
            f"{self.threshold:.0%}): the loader, not the device, sets the pace{_try(self.fixes())}"
        )

    def fixes(self) -> list[str]:
        return data_wait_fixes(self.setting)

    def summary(self) -> str | None:
        """The end-of-run reminder, when any epoch waited too long."""
        if not self.slow_epochs:
            return None
        worst = max(fraction for _, fraction in self.slow_epochs)
        said = f"data wait over {self.threshold:.0%} in {len(self.slow_epochs)} epoch(s) (up to {worst:.0%})"
        return said + _try(self.fixes())


def _try(fixes: list[str]) -> str:
    """The fixes as the message's end; none where this host offers none (cores used, small images, local disk)."""
    return (". Try: " + "; ".join(fixes)) if fixes else ""
