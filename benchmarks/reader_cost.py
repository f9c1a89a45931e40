"""What a class-folder reader's sample list costs one process: ``python -m benchmarks.reader_cost``.

Run by the scale task (benchmarks/scale.py) in a fresh process per reader and tree, so that the
memory measured is that one list's. For ``vtools`` (``open_source`` over the tree's train split) or
``timm`` (``timm.data.ImageDataset`` over the same folder), with torch, timm and vtools imported
before any clock starts:

- scan: wall seconds to build the sample list;
- index: the process's resident memory after the build minus before it (each after ``gc.collect()``);
- worker growth: a DataLoader (2 workers, forked as on Linux by default) over the list, returning
  labels only (each item's path is touched, as a real item's would be, and no image is opened), one
  shuffled epoch in batches of 256; each worker reads its private memory (Private_Clean +
  Private_Dirty) at its first item and after each batch; the growth is the largest over workers;
- with ``--heap``, instead: the bytes Python's allocators hold for the list (tracemalloc), a separate
  pass because tracing slows the build.

The last line of stdout is the figures as JSON.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

READERS = ("vtools", "timm")
WORKERS = 2
BATCH = 256
MIB = 2**20


def private_bytes() -> int:
    """This process's private memory: the pages only it maps (copied on write after a fork, or its own),
    Private_Clean + Private_Dirty of /proc/self/smaps_rollup."""
    total = 0
    with open("/proc/self/smaps_rollup", encoding="ascii") as handle:
        for line in handle:
            if line.startswith(("Private_Clean:", "Private_Dirty:")):
                total += int(line.split()[1]) * 1024
    return total


def resident_bytes() -> int:
    """This process's resident memory (VmRSS of /proc/self/status)."""
    with open("/proc/self/status", encoding="ascii") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise OSError("no VmRSS in /proc/self/status")


def build(reader: str, tree: Path) -> tuple[Any, Callable[[int], tuple[str, int]], int]:
    """The reader's sample list over ``tree``'s train split, a function giving sample ``i``'s (path,
    label) as an item would read them (no image opened), and the list's length."""
    if reader == "vtools":
        from vtools.data.readers.registry import SourceRequest, open_source

        source = open_source(SourceRequest("", str(tree), "train"))
        store = source.samples
        return source, lambda index: (store.paths[index], store.labels[index]), len(source)
    from timm.data import ImageDataset

    dataset = ImageDataset(str(tree / "train"))
    samples = dataset.reader.samples  # (path, label) pairs: what ImageDataset[i] opens
    return dataset, lambda index: samples[index], len(dataset)


class LabelsOnly:
    """A map-style dataset whose items are whole batches of indices: each touches its samples' paths and
    labels and returns the worker's private memory at its first item and now (reading /proc per
    batch, not per item, keeps the reading's cost out of the epoch)."""

    def __init__(self, sample: Callable[[int], tuple[str, int]], length: int) -> None:
        self.sample, self.length = sample, length
        self.first: int | None = None

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, indices: list[int]) -> tuple[int, int, int, int]:
        import torch.utils.data

        if self.first is None:  # this worker's first item (each worker holds its own copy)
            self.first = private_bytes()
        touched = 0
        for index in indices:
            path, label = self.sample(index)
            touched += len(path) + label
        info = torch.utils.data.get_worker_info()
        return (info.id if info else 0), self.first, private_bytes(), touched


def worker_growth(sample: Callable[[int], tuple[str, int]], length: int) -> float:
    """The largest growth of a loader worker's private memory over one shuffled epoch, in bytes."""
    import torch
    from torch.utils.data import BatchSampler, DataLoader, RandomSampler

    order = BatchSampler(RandomSampler(range(length), generator=torch.Generator().manual_seed(0)), BATCH, False)
    loader = DataLoader(LabelsOnly(sample, length), batch_size=None, sampler=order, num_workers=WORKERS)
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for worker, at_first, now, _ in loader:
        first[int(worker)], last[int(worker)] = int(at_first), int(now)
    return max(last[worker] - first[worker] for worker in first)


def measure(reader: str, tree: Path, heap: bool = False) -> dict[str, Any]:
    """The figures of one reader over one tree (see the module docstring)."""
    import tracemalloc

    import timm.data  # noqa: F401 - imported before the clock, as the scripts have it by then
    import torch  # noqa: F401

    import vtools.data.readers.registry  # noqa: F401

    gc.collect()
    if heap:
        tracemalloc.start()
    before = resident_bytes()
    start = time.perf_counter()
    built, sample, length = build(reader, tree)
    seconds = time.perf_counter() - start
    gc.collect()
    if heap:
        held = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        return {"reader": reader, "files": length, "heap_mib": round(held / MIB, 2)}
    index = resident_bytes() - before
    growth = worker_growth(sample, length)
    return {
        "reader": reader,
        "files": length,
        "scan_s": round(seconds, 3),
        "index_mib": round(index / MIB, 2),
        "worker_growth_mib": round(growth / MIB, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("reader", choices=READERS)
    parser.add_argument("tree", type=Path, help="a folder holding train/<class>/<image>")
    parser.add_argument("--heap", action="store_true", help="trace Python's allocations instead")
    args = parser.parse_args()
    print(json.dumps(measure(args.reader, args.tree, args.heap)), flush=True)


if __name__ == "__main__":
    main()
