"""train.py on shards streamed from a real HTTP server on localhost (docs/data.md#shards-from-a-server): a run
stopped mid-epoch by SIGTERM, and a run whose server goes away mid-epoch (exit 75, one line naming the shard,
a resumable checkpoint), both continued with ``--resume auto``, end with the weights of a run that was never
interrupted: the stream's order is a function of (seed, epoch, rank, worker), and a resumed epoch skips
exactly the samples it trained."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.conftest import (
    assert_same_weights,
    free_port,
    run_script,
    start_script,
    train_args,
    weights,
)
from tests.data.readers.shard_server import serve

pytestmark = [pytest.mark.slow, pytest.mark.cpu_only(reason="the stream and its stops are host-side")]


@pytest.fixture(scope="module")
def shards(fashion4: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """fashion4 (240 training, 60 validation images) in shards of 50: five training shards, the last short."""
    out = tmp_path_factory.mktemp("http-shards") / "fashion4"
    made = run_script(["-m", "vtools", "shards", str(fashion4), str(out), "--shard-size", "50"])
    assert made.returncode == 0, made.stderr
    return out


def run_args(url: str, out: Path, name: str) -> list[str]:
    return train_args(
        Path("unused"),
        out,
        name,
        "--device",
        "cpu",
        "--epochs",
        "2",
        "--log-interval",
        "1",
        "--resume",
        "auto",
        "--workers",
        "2",
        "--wds-shuffle-size",
        "16",
        "--dataset",
        "wds/fashion4",
        "--data-dir",
        url,
    )


def test_sigterm_mid_epoch_resumes_exactly(shards: Path, tmp_path: Path) -> None:
    with serve(shards) as url:
        args = run_args(url, tmp_path, "stopped")
        proc = start_script(args)
        for line in proc.stdout:
            if " epoch 0 (1 of 2) step 2/" in line:
                break
        os.killpg(proc.pid, signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 143, stderr
        assert "SIGTERM: saved a resumable checkpoint at epoch 0 step" in stdout
        resumed = run_script(args)
        assert resumed.returncode == 0, resumed.stderr
        assert "resumed from" in resumed.stdout and "at epoch 0, step" in resumed.stdout
        reference = run_script(run_args(url, tmp_path, "reference"))
        assert reference.returncode == 0, reference.stderr
    assert_same_weights(
        weights(tmp_path / "reference" / "last.pth.tar"), weights(tmp_path / "stopped" / "last.pth.tar")
    )


def test_a_server_that_goes_away_mid_epoch_is_one_line_and_a_resumable_stop(shards: Path, tmp_path: Path) -> None:
    port = free_port()
    with serve(shards, die_after=2, port=port) as url:  # two shards whole, then it dies inside the third
        args = run_args(url, tmp_path, "lost")
        lost = run_script(args)
    assert lost.returncode == 75, lost.stderr
    lines = [line for line in lost.stdout.splitlines() if "saved a resumable checkpoint" in line]
    assert len(lines) == 1, lost.stdout
    assert lines[0].startswith(f"shard {url}/fashion4-train-0000") and "curl exited with status" in lines[0]
    assert "at epoch 0 step" in lines[0] and "--resume auto" in lines[0]
    assert "Traceback" not in lost.stderr
    with serve(shards, port=port):  # the server is back
        resumed = run_script(args)
        assert resumed.returncode == 0, resumed.stderr
        reference = run_script(run_args(url, tmp_path, "reference"))
        assert reference.returncode == 0, reference.stderr
    assert_same_weights(weights(tmp_path / "reference" / "last.pth.tar"), weights(tmp_path / "lost" / "last.pth.tar"))
