"""Setups and checks for first_hour.yaml: what a new user meets in the first hour on a CPU-only, 2-core host.

The checks hold on any host: where the outcome depends on the CPU (native bfloat16 or not) or its core count
(a config's workers cut or not), they ask the host the same question vtools asks and expect its answer.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from tests.conftest import fashion_subset
from vtools.runtime.cpu_bf16 import host_bf16

TORCH_WORKER_WARNING = "worker processes in total"  # torch's "This DataLoader will create 4 worker processes ..."


def timm_args_yaml(tmp: Path) -> None:
    """A timm args.yaml (device: cuda and workers: 4, timm's defaults) for a one-epoch run of a tiny model on
    a few images of each class."""
    from tests.timm_reference import timm_args_yaml as written_by_timm

    fashion_subset(tmp / "data", 6, 3)
    argv = ["--model", "test_resnet", "--epochs", "1", "--batch-size", "8", "--lr", "0.01"]
    (tmp / "args.yaml").write_text(written_by_timm("train.py", argv), encoding="utf-8")


def amp_follows_the_cpu(tmp: Path, proc: subprocess.CompletedProcess) -> None:
    """bfloat16 where the CPU computes it natively, else float32 with the reason (env and train alike)."""
    out = proc.stdout
    if host_bf16().native:
        assert "amp_policy: bfloat16" in out or "on cpu (bfloat16)" in out, out
        assert "no native bfloat16" not in out, out
    else:
        assert "float32 (this CPU has no native bfloat16" in out, out
        assert "amp_policy: bfloat16" not in out and "on cpu (bfloat16)" not in out, out


def readme_amp_example(tmp: Path, proc: subprocess.CompletedProcess) -> None:
    """The README's --amp example: the precision as above, and the best score as its epoch line printed it."""
    amp_follows_the_cpu(tmp, proc)
    assert re.search(r"^best top1 \d+\.\d\d at epoch \d+;", proc.stdout, re.MULTILINE), proc.stdout


def workers_within_the_cores(tmp: Path, proc: subprocess.CompletedProcess) -> None:
    """The config's workers: 4 goes through the cpu budget: cut to the cores, said, and no torch warning;
    no data-wait advice for a run of a few batches."""
    assert TORCH_WORKER_WARNING not in proc.stderr, proc.stderr
    cores = len(os.sched_getaffinity(0))
    cut = f"(--workers 4 cut to the {cores} cores this process may use)"
    assert (cut in proc.stdout) == (cores < 4), proc.stdout
    # 3 batches an epoch: their wait is the workers' start, and the data is on this host's disk
    assert "data wait:" not in proc.stdout and "SSD" not in proc.stdout, proc.stdout
