"""The bench's options as its measurements take them: ``python3 -m benchmarks``'s flags, typed and frozen.

The bench parses its own command line (benchmarks/command.py) and builds :class:`BenchOptions`
once (``vtools.cli.typed.typed_options``); every measurement, in the parent or in a child process,
reads this object. Field names are the flags' dests; the defaults live only in the flag definitions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vtools.options.train_job import TrainJob


@dataclass(frozen=True)
class BenchOptions:
    """What is measured, on what, and how long."""

    model: str  # a timm name, created with 10 classes
    data: str  # an image folder with train/ and val/
    tasks: list[str]
    modes: list[str]
    sources: list[str]  # where the vtools mode reads the images: folder, wds, parquet
    max_side: int | None  # decode task: also shards storing images with their longer side <= N
    batch_size: int
    steps: int  # timed batches per measurement
    warmup: int  # untimed batches first
    workers: int | None  # None: vtools' default
    device: str
    device_modules: list[str]
    amp: bool
    amp_dtype: str
    channels_last: bool
    recipe_epochs: int
    repeats: int  # recipe, onepass, recovery: runs (or stretches) alternated this many times, the median reported
    timm_train: str  # onepass: timm's own train.py as the reference; '' for the plain loop
    recovery_every: int  # recovery: updates between recovery checkpoints
    recovery_slow_disk: float  # recovery: the throttled writer's speed, MB/s
    scale_sizes: str  # scale: the trees' file counts, comma-separated
    scale_trees: str  # scale: the folder keeping the synthetic trees between runs
    scale_dir: str  # scale: where scale.csv and scale.png go
    stores: str  # the converted copies of the images, made by the parent process


def train_job(flags: list[str]) -> TrainJob:
    """train.py's typed job for a train.py command line, parsed and checked as train.py does (the data
    folder given as DIR is --data-dir then): the loaders and components the bench times are train.py's."""
    from vtools.cli import train_flags
    from vtools.cli.typed import typed_options
    from vtools.options.train_job import TrainJob

    return typed_options(TrainJob, train_flags.parse(flags))
