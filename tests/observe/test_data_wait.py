"""What a training run tells a person: the data-wait verdict, progress lines in a log file, the run's ETA.

The verdict is driven by train_one_epoch's own measurement, on every device: a loader made slow on purpose
must bring it, a fast loader feeding a slow model must not.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from vtools.data.loaders import Batch
from vtools.observe.data_wait import (
    MIN_STEPS,
    THRESHOLD,
    DataWaitVerdict,
    LoaderSetting,
    data_wait_fixes,
    filesystem_of,
    on_local_disk,
)
from vtools.run_events import LogPoint
from vtools.runtime.amp import resolve_amp
from vtools.runtime.cpu_budget import plan
from vtools.train.loop import TrainComponents, train_one_epoch
from vtools.train.run_clock import RunClock, clock_text

STEPS, PAUSE = 6, 0.04


class Model(torch.nn.Module):
    """A linear classifier whose forward takes at least ``pause`` seconds: a model slower than its loader."""

    def __init__(self, pause: float = 0.0) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(6, 3)
        self.pause = pause

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        time.sleep(self.pause)
        return self.linear(images)


class Loader:
    """``STEPS`` batches, each ``pause`` seconds late."""

    def __init__(self, device: torch.device, pause: float = 0.0) -> None:
        self.batches = [
            Batch(torch.randn(4, 6, device=device), torch.randint(0, 3, (4,), device=device), torch.arange(4))
            for _ in range(STEPS)
        ]
        self.pause = pause

    def __len__(self) -> int:
        return STEPS

    def __iter__(self) -> Iterator[Batch]:
        for batch in self.batches:
            time.sleep(self.pause)
            yield batch


def epoch(device: torch.device, loader_pause: float, model_pause: float, on_log=None, log_interval: int = 2):
    model = Model(model_pause).to(device)
    parts = TrainComponents(
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        loss_fn=torch.nn.CrossEntropyLoss(),
        amp=resolve_amp(device, False),
        device=device,
    )
    result, _ = train_one_epoch(
        parts, Loader(device, loader_pause), 0, 0, log_interval=log_interval, show_progress=False, on_log=on_log
    )
    return result


def setting(tmp_path: Path, cores: int = 2, workers: int | None = None, side: int = 28) -> LoaderSetting:
    from PIL import Image

    tmp_path.mkdir(parents=True, exist_ok=True)
    files = []
    for i in range(3):
        files.append(str(tmp_path / f"{i}.png"))
        Image.new("RGB", (side, side * 3 // 4)).save(files[-1])
    return LoaderSetting(plan("npu", cores, workers), workers is not None, True, str(tmp_path), 32, tuple(files))


def test_data_wait_verdict_comes_with_a_slow_loader_once(device: torch.device, tmp_path: Path) -> None:
    verdict = DataWaitVerdict(setting(tmp_path, cores=16))  # cores to spare: more workers is a fix
    slow = epoch(device, loader_pause=PAUSE, model_pause=0.0)
    assert slow.data_wait > 0.8  # measured by the loop itself
    message = verdict.epoch(0, slow.data_wait)
    assert message is not None and f"{slow.data_wait:.0%}" in message and "Try:" in message
    assert verdict.epoch(1, epoch(device, PAUSE, 0.0).data_wait) is None  # said once
    assert "in 2 epoch(s)" in verdict.summary()  # the end of the run repeats it


def test_no_data_wait_verdict_when_the_loader_keeps_up(device: torch.device, tmp_path: Path) -> None:
    verdict = DataWaitVerdict(setting(tmp_path))
    fast = epoch(device, loader_pause=0.0, model_pause=PAUSE)
    assert fast.data_wait < THRESHOLD / 2
    assert verdict.epoch(0, fast.data_wait) is None and verdict.summary() is None


@pytest.mark.cpu_only(reason="the advice is computed on the host from the cpu budget and image headers")
def test_data_wait_fixes_fit_the_host(tmp_path: Path) -> None:
    """More workers only where the budget has spare cores; pre-resized shards only for images larger
    than twice the training size; a faster store always."""
    roomy = data_wait_fixes(setting(tmp_path / "a", cores=16, workers=2, side=28))
    assert roomy[0].startswith("more loader workers: --workers 15 of this process's 16 cores")
    assert not any("shards" in fix for fix in roomy)  # 28-px images: resizing would not help
    full = data_wait_fixes(setting(tmp_path / "b", cores=2, side=500), mounts=on_nfs(tmp_path))
    assert not any("--workers" in fix for fix in full)  # 1 worker + the main process = 2 cores
    assert any("--max-side 64" in fix and "--dataset wds/" in fix for fix in full)
    assert full[-1] == "read faster: put the data on a local SSD or in /dev/shm (it is on nfs4, not a local disk)"


def on_nfs(path: Path) -> str:
    """/proc/mounts of a host where ``path`` is on an NFS share mounted over a local root."""
    return f"/dev/vda / ext4 rw 0 0\ntmpfs /dev/shm tmpfs rw 0 0\nserver:/export {path} nfs4 rw 0 0\n"


@pytest.mark.cpu_only(reason="reads mount tables on the host")
def test_a_faster_store_only_where_the_data_is_not_known_local(tmp_path: Path) -> None:
    """A 120-image run from a local disk was told to move its data to an SSD: the store advice comes only
    where the data's filesystem is not a local kind, or cannot be told."""
    data = tmp_path / "data"
    local = "/dev/vda / ext4 rw 0 0\ntmpfs /dev/shm tmpfs rw 0 0\n"
    assert filesystem_of(str(data), on_nfs(tmp_path)) == "nfs4" and not on_local_disk(str(data), on_nfs(tmp_path))
    assert filesystem_of("/dev/shm/x", local) == "tmpfs" and on_local_disk("/dev/shm/x", local)
    assert filesystem_of(str(data), local) == "ext4" and on_local_disk(str(data), local)
    assert filesystem_of(f"{tmp_path}-other/x", on_nfs(tmp_path)) == "ext4"  # a sibling, not inside the share
    assert not any("read faster" in fix for fix in data_wait_fixes(setting(tmp_path / "a"), mounts=local))
    unknown = data_wait_fixes(setting(tmp_path / "b"), mounts="")  # no mount table: not known to be local
    assert unknown[-1] == "read faster: put the data on a local SSD or in /dev/shm rather than a network filesystem"


@pytest.mark.cpu_only(reason="arithmetic on a measured share")
def test_a_short_epoch_brings_no_verdict(tmp_path: Path) -> None:
    """An epoch of a few batches waits mostly for its workers to start: no verdict until MIN_STEPS batches."""
    verdict = DataWaitVerdict(setting(tmp_path))
    assert verdict.epoch(0, 0.9, steps=MIN_STEPS - 1) is None and verdict.summary() is None
    assert verdict.epoch(1, 0.9, steps=MIN_STEPS) is not None


def test_progress_lines_in_a_log_file(device: torch.device) -> None:
    """Without a terminal every log step is one line: timestamp, epoch, step, loss, lr, img/s, ETA."""
    lines: list[str] = []
    clock = RunClock(epochs=2, steps_per_epoch=STEPS, validates=lambda e: True, lines=True)
    clock.epoch_started()
    epoch(device, 0.0, 0.0, on_log=lambda point: lines.append(clock.step_line(point)))
    assert len(lines) == STEPS // 2
    pattern = (
        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d epoch 0 \(1 of 2\) step (\d)/6 loss \d+\.\d{4} lr 0\.1 "
        r"\d+\.\d img/s elapsed \d:\d\d:\d\d ETA \d:\d\d:\d\d"
    )
    steps = [int(re.fullmatch(pattern, line).group(1)) for line in lines]
    assert steps == [2, 4, 6]
    quiet = RunClock(epochs=2, steps_per_epoch=STEPS, validates=lambda e: True, lines=False)
    assert quiet.step_line(LogPoint(0, 2, 6, 0, 2, 1.0, 0.1, 10.0, 0.0)) is None  # a terminal has its bar


@pytest.mark.cpu_only(reason="arithmetic on the host's clock")
def test_eta_counts_the_steps_and_validations_left(monkeypatch: pytest.MonkeyPatch) -> None:
    """Epoch 0 trained 10 steps in 10 s and validated in 2 s; 5 s into epoch 1 (step 5 of 10): 1 s a step,
    5 steps left and one validation left = 7 s. A run resumed at epoch 1 step 4 times only its own steps."""
    now = [100.0]
    monkeypatch.setattr("vtools.train.run_clock.time.perf_counter", lambda: now[0])
    clock = RunClock(epochs=2, steps_per_epoch=10, validates=lambda e: True)
    clock.epoch_started()
    now[0] += 10
    clock.epoch_trained(10.0, 10)
    clock.validated(2.0)
    clock.epoch_started()
    now[0] += 5
    assert clock.eta(1, 5) == pytest.approx(7.0)
    assert clock_text(clock.elapsed) == "0:00:15"
    resumed = RunClock(epochs=3, steps_per_epoch=10, validates=lambda e: e == 2, first=(1, 4))
    resumed.epoch_started()
    assert resumed.eta(1, 4) is None  # nothing timed yet
    now[0] += 2
    assert resumed.eta(1, 6) == pytest.approx(1.0 * (4 + 10))  # 2 steps in 2 s; no validation timed yet
