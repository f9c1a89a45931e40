"""Recovery checkpoints end to end: a process killed without warning (SIGKILL: no checkpoint of its own)
loses at most --recovery-interval updates, plus those trained while the newest one was still being written
(at most one interval more: the next one waits for it), and the run it continues ends with an uninterrupted
run's weights; under ``torchrun --max-restarts`` the restarted group does this by itself."""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
from pathlib import Path

import pytest
import torch

from tests.conftest import (
    DEVICE_TYPES,
    ONE_THREAD,
    assert_same_weights,
    children,
    device_flags,
    free_port,
    rank_of,
    run_script,
    start_script,
    summary,
    train_args,
    weights,
)

INTERVAL = 3
# dropout and mixup draw from each rank's random streams: a resume that lost them would train differently
COMMON = ["--epochs", "2", "--batch-size", "8", "--log-interval", "1", "--drop", "0.3", "--mixup", "0.3"]
RECOVERY = ["--recovery-interval", str(INTERVAL), "--resume", "auto"]
REDONE = re.compile(r"(\d+) update\(s\) are trained again")
# a kill while the newest checkpoint is still being written in the background loses that one too (seen in a
# full suite on 2 busy cores: killed at update 13, the one of update 12 not yet on disk, 4 redone); the
# next checkpoint waits for it, so at most two intervals are ever trained again
MOST_REDONE = 2 * INTERVAL


def launch(args: list[str]) -> subprocess.Popen:
    """``python <args>`` in a session of its own, one thread, its output read as lines."""
    return start_script(args, env=ONE_THREAD)


def wait_for_step(process: subprocess.Popen, epoch: int, step: int) -> list[str]:
    """Read the run's lines until the log line of ``step`` in ``epoch``; the lines read."""
    lines = []
    for line in process.stdout:
        lines.append(line)
        if f"epoch {epoch} (" in line and f" step {step}/" in line:
            return lines
    raise AssertionError(f"the run ended before epoch {epoch} step {step}: {process.stderr.read()[-3000:]}")


def redone_updates(stdout: str) -> int:
    """The updates the resumed run says it trains again (0 when the kill came right after a checkpoint)."""
    found = REDONE.search(stdout)
    return int(found.group(1)) if found else 0


@pytest.mark.parametrize("device_type", DEVICE_TYPES)
def test_sigkill_loses_at_most_the_interval_and_the_resume_is_exact(
    device_type: str, fashion4: Path, tmp_path: Path
) -> None:
    """SIGKILL at a random step of the first epoch (240 images, 30 steps): nothing but the recovery
    checkpoints is left, --resume auto continues the newest, says how many updates it trains again (at
    most the interval), and ends with the weights and EMA of a run that was never killed."""
    step = random.Random().randint(INTERVAL + 1, 26)
    print(f"killed after the log line of step {step}")  # shown when the test fails
    flags = [*device_flags(device_type), *COMMON, "--model-ema"]
    killed = launch(train_args(fashion4, tmp_path, "killed", *flags, *RECOVERY))
    try:
        wait_for_step(killed, 0, step)
        os.killpg(killed.pid, signal.SIGKILL)
        killed.wait(timeout=60)
    finally:
        if killed.poll() is None:
            os.killpg(killed.pid, signal.SIGKILL)
    folder = tmp_path / "killed"
    assert not (folder / "last.pth.tar").exists()
    # --recovery-keep's default (2), plus one when the kill lands between a write and its pruning: the
    # resumed run's first recovery write removes it (tests/train/test_recovery.py)
    assert 1 <= len(list(folder.glob("recovery-0-*.pth.tar"))) <= 3
    resumed = run_script(train_args(fashion4, tmp_path, "killed", *flags, *RECOVERY), env=ONE_THREAD, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed from {folder / 'recovery-0-'}" in resumed.stdout
    assert 0 <= redone_updates(resumed.stdout) <= MOST_REDONE
    reference = run_script(train_args(fashion4, tmp_path, "reference", *flags), env=ONE_THREAD, timeout=300)
    assert reference.returncode == 0, reference.stderr[-3000:]
    for key in ("state_dict", "state_dict_ema"):
        assert_same_weights(
            weights(tmp_path / "reference" / "last.pth.tar", key), weights(folder / "last.pth.tar", key)
        )


def torchrun_restartable(args: list[str]) -> list[str]:
    """``python -m torch.distributed.run`` with 2 ranks and one restart allowed, then ``args``."""
    return [
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--max-restarts",
        "1",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_port()),
        *args,
    ]


@pytest.mark.slow
@pytest.mark.parametrize("device_type", DEVICE_TYPES)
def test_torchrun_restarts_a_killed_rank_from_the_newest_recovery_checkpoint(
    device_type: str, fashion4: Path, tmp_path: Path
) -> None:
    """A random rank SIGKILLed at a random step of epoch 0 (2 ranks x 8 images: 15 steps): torchrun
    restarts the group with the same command line, which finds its own run folder (the dead rank 0's
    lock gone with it), continues from the newest recovery checkpoint, redoes at most the interval, and
    ends with the weights of a 2-rank run that was never killed."""
    chooser = random.Random()
    step, rank = chooser.randint(INTERVAL + 1, 12), chooser.choice([0, 1])
    print(f"rank {rank} killed after the log line of step {step}")
    flags = [*device_flags(device_type), *COMMON]
    launcher = launch(torchrun_restartable(train_args(fashion4, tmp_path, "restarted", *flags, *RECOVERY)))
    try:
        before = wait_for_step(launcher, 0, step)
        ranks = {rank_of(pid): pid for pid in children(launcher.pid)}
        os.kill(ranks[rank], signal.SIGKILL)
        stdout, stderr = launcher.communicate(timeout=300)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
    assert launcher.returncode == 0, stderr[-3000:]
    assert f"resumed from {tmp_path / 'restarted' / 'recovery-0-'}" in stdout, stdout[-3000:]
    assert 0 <= redone_updates(stdout) <= MOST_REDONE
    assert "".join(before).count("training test_resnet") == 1 and stdout.count("training test_resnet") == 1
    state = torch.load(tmp_path / "restarted" / "last.pth.tar", map_location="cpu", weights_only=True)
    assert state["epoch"] == 2 and len(state["rank_states"]) == 2
    reference = run_script(
        torchrun_restartable(train_args(fashion4, tmp_path, "reference", *flags)), env=ONE_THREAD, timeout=300
    )
    assert reference.returncode == 0, reference.stderr[-3000:]
    assert_same_weights(
        weights(tmp_path / "reference" / "last.pth.tar"), weights(tmp_path / "restarted" / "last.pth.tar")
    )


# Two agents of one elastic job on this host, each with one process (c10d rendezvous). A short last call
# and keep-alive make the survivor restart in seconds, not torchrun's default ~30 s; the agent that hosts
# the rendezvous store must survive (the job ends with it), so the other one is killed.
ELASTIC_CONF = "last_call_timeout=3,keep_alive_interval=1,keep_alive_max_attempt=3"


def elastic_agent(port: int, hosts_store: bool, args: list[str]) -> list[str]:
    return [
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "1:2",
        "--nproc-per-node",
        "1",
        "--max-restarts",
        "3",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "--rdzv-id",
        "elastic-test",
        "--rdzv-conf",
        f"{ELASTIC_CONF},is_host={int(hosts_store)}",
        *args,
    ]


def kill_agent(agent: subprocess.Popen) -> None:
    """SIGKILL an agent and its workers (torchrun starts each worker in a session of its own)."""
    for pid in [*children(agent.pid), agent.pid]:
        for child in children(pid):
            os.kill(child, signal.SIGKILL)
        os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
@pytest.mark.parametrize("device_type", DEVICE_TYPES)
def test_an_elastic_job_that_loses_an_agent_finishes_on_the_other_with_the_same_global_batch(
    device_type: str, fashion4: Path, tmp_path: Path
) -> None:
    """``--nnodes 1:2``: one agent killed at a random step of epoch 0 (2 processes x 8 images, 15 steps).
    The survivor restarts its process alone, which continues from the newest recovery checkpoint with 2
    accumulation steps (said in one line: the global batch stays 16), and every epoch of summary.csv
    trained each of the 240 images once: the position is kept in samples, not steps."""
    step = random.Random().randint(INTERVAL + 1, 12)
    print(f"an agent killed after the log line of step {step}")
    port = free_port()
    flags = train_args(fashion4, tmp_path, "elastic", *device_flags(device_type), *COMMON, *RECOVERY)
    survivor = launch(elastic_agent(port, True, flags))
    victim = launch(elastic_agent(port, False, flags))
    try:
        wait_for_any_step([survivor, victim], step)
        kill_agent(victim)
        stdout, stderr = survivor.communicate(timeout=300)
        victim.communicate(timeout=60)
    finally:
        for agent in (survivor, victim):
            if agent.poll() is None:
                os.killpg(agent.pid, signal.SIGKILL)
    assert survivor.returncode == 0, stderr[-3000:]
    assert "torchrun continues the run on 1 process(es) instead of 2: --grad-accum-steps 1 -> 2 keeps its " in stdout
    assert f"resumed from {tmp_path / 'elastic' / 'recovery-0-'}" in stdout
    rows = summary(tmp_path / "elastic")
    assert [int(row["train_samples"]) for row in rows] == [240, 240]
    state = torch.load(tmp_path / "elastic" / "last.pth.tar", map_location="cpu", weights_only=True)
    assert state["world_size"] == 1 and state["args"]["grad_accum_steps"] == 2


def wait_for_any_step(agents: list[subprocess.Popen], step: int) -> list[str]:
    """Read the agents' lines (only rank 0 prints the log) until epoch 0's log line of ``step``."""
    import selectors

    lines: list[str] = []
    with selectors.DefaultSelector() as selector:
        for agent in agents:
            selector.register(agent.stdout, selectors.EVENT_READ)
        while True:
            for key, _ in selector.select(timeout=120):
                line = key.fileobj.readline()
                lines.append(line)
                if "epoch 0 (" in line and f" step {step}/" in line:
                    return lines
            if all(agent.poll() is not None for agent in agents):
                raise AssertionError(f"the job ended before step {step}: {''.join(lines)[-3000:]}")
