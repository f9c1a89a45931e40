"""A torchrun job whose rank stops (SIGSTOP) ends within ``--dist-timeout`` + 30 s, non-zero, with one line naming
the rank, and leaves its recovery checkpoints for --resume auto: the heartbeat (vtools/runtime/heartbeat.py) on
cpu/gloo and on the emulated npu's hccl."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest

from tests.conftest import DEVICE_TYPES, ONE_THREAD, children, device_flags, rank_of, start_script, torchrun, train_args
from tests.scripts.test_train import two_devices
from vtools.train.checkpoint import load_training_state, recovery_files

DIST_TIMEOUT = 20


@pytest.mark.slow
@pytest.mark.parametrize("device_type", DEVICE_TYPES)
def test_a_stopped_rank_ends_the_job_in_one_line(device_type: str, fashion4: Path, tmp_path: Path) -> None:
    two_devices(device_type)
    # more epochs than the test lets it train (3 take a second here): the stop comes mid-run on any machine
    flags = [*device_flags(device_type), "--dist-timeout", str(DIST_TIMEOUT), "--log-interval", "1", "--epochs", "200"]
    flags += ["--recovery-interval", "2"]
    stderr_path = tmp_path / "stderr.txt"
    with stderr_path.open("w") as stderr:  # a file, not a pipe: nobody reads it while the job runs
        launcher = start_script(torchrun(train_args(fashion4, tmp_path, "hang", *flags)), env=ONE_THREAD, stderr=stderr)
    ranks: dict[int | None, int] = {}
    try:
        for line in launcher.stdout:
            if re.search(r" epoch 0 \(.* step \d+/", line):  # the first step's log line: training runs
                break
        else:
            pytest.fail(f"the job ended before its first step: {stderr_path.read_text()[-3000:]}")
        ranks = {rank_of(pid): pid for pid in children(launcher.pid)}
        assert set(ranks) >= {0, 1}, ranks
        time.sleep(1.5)  # one beat (a second at this timeout) carries rank 1's logged step to the store
        os.kill(ranks[1], signal.SIGSTOP)
        stopped_at = time.monotonic()
        output, _ = launcher.communicate(timeout=DIST_TIMEOUT + 90)
        took = time.monotonic() - stopped_at
    finally:  # torchrun may start its ranks in sessions of their own: each is killed by its pid too
        for pid in [launcher.pid, *ranks.values()]:
            try:
                os.killpg(pid, signal.SIGKILL) if pid == launcher.pid else os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        launcher.wait()
    errors = stderr_path.read_text()
    assert launcher.returncode != 0 and "finished in" not in output, errors[-3000:]
    assert took <= DIST_TIMEOUT + 30, f"the job ended {took:.0f} s after the stop"
    naming = [line for line in errors.splitlines() if re.search(r"\brank 1\b", line)]
    assert len(naming) == 1, errors[-3000:]
    said = r"train\.py: error: rank 1 \(host .+, pid \d+, (cpu|npu:1)\) has not answered for 2\d s"
    assert re.match(said, naming[0]), naming
    assert re.search(r"\(last step: epoch \d step \d\)", naming[0]) and "--resume auto" in naming[0], naming
    recovery = recovery_files(tmp_path / "hang")
    assert recovery, "no recovery checkpoint left for --resume auto"
    assert load_training_state(recovery[-1])["world_size"] == 2  # whole and resumable
