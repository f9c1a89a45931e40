"""Two torchrun agents on one host train one run, as two machines each running one agent do.

The run of two agents (``--nnodes 2``, one process each) must be the run of one agent with two
processes: the same global ranks, so the same data shards and per-rank random streams, hence the
same weights, and one run folder written by global rank 0 although each agent has a local rank 0.
Both rendezvous kinds are covered: static (``--node-rank`` and ``--master-addr``, the command in
docs/devices.md) and c10d (``--rdzv-endpoint``; it ignores ``--node-rank`` and orders the agents
itself, which on one host with one command line changes nothing).
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import (
    DEVICE_TYPES,
    REPO,
    assert_same_weights,
    device_flags,
    free_port,
    run_script,
    train_args,
    weights,
)

# dropout and mixup draw from each rank's own generators: a rank that got another's seed trains differently
FLAGS = ["--epochs", "2", "--batch-size", "8", "--drop", "0.3", "--mixup", "0.3"]
ENV = {"OMP_NUM_THREADS": "1"}


def rendezvous_flags(kind: str, port: int, node_rank: int) -> list[str]:
    """torchrun's flags that make an agent node ``node_rank`` of two meeting on this host at ``port``."""
    if kind == "static":
        return ["--node-rank", str(node_rank), "--master-addr", "127.0.0.1", "--master-port", str(port)]
    return ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "two-agents"]


def two_agents(kind: str, train: list[str], logs: Path, timeout: float = 300) -> list[subprocess.CompletedProcess]:
    """Start two torchrun agents of one process each (``--nnodes 2``) on ``train`` and wait for both. When one
    fails the other is stopped at once: it would wait for its peer in the rendezvous for minutes. Their
    output goes to files in ``logs``, so that neither blocks on a full pipe while the other is waited for."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO), **ENV}
    logs.mkdir(parents=True, exist_ok=True)
    outputs = [(logs / f"agent{rank}.out", logs / f"agent{rank}.err") for rank in (0, 1)]
    agents = []
    for node_rank, (out, err) in enumerate(outputs):
        with out.open("w") as stdout, err.open("w") as stderr:
            agents.append(
                subprocess.Popen(
                    [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1"]
                    + [*rendezvous_flags(kind, port, node_rank), *train],
                    cwd=REPO,
                    env=env,
                    stdout=stdout,
                    stderr=stderr,
                )
            )
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and not all(agent.poll() == 0 for agent in agents):
            if any(agent.poll() not in (None, 0) for agent in agents):
                break
            time.sleep(0.2)
    finally:
        for agent in agents:  # an agent still running takes its workers down on SIGTERM
            if agent.poll() is None:
                agent.send_signal(signal.SIGTERM)
                agent.wait(timeout=60)
    return [
        subprocess.CompletedProcess(agent.args, agent.returncode, out.read_text(), err.read_text())
        for agent, (out, err) in zip(agents, outputs)
    ]


@pytest.fixture(scope="module")
def one_agent_run(fashion4: Path, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """The folder of a run of one agent with two processes, per device type (made once for the module)."""

    @functools.cache
    def run(device_type: str) -> Path:
        out = tmp_path_factory.mktemp(f"one_agent_{device_type}")
        train = train_args(fashion4, out, "one", *FLAGS, *device_flags(device_type))
        port = ["--master-addr", "127.0.0.1", "--master-port", str(free_port())]
        proc = run_script(["-m", "torch.distributed.run", "--nproc-per-node", "2", *port, *train], env=ENV)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return out / "one"

    return run


@pytest.mark.parametrize("kind", ["static", "c10d"])
@pytest.mark.parametrize("device_type", [d for d in DEVICE_TYPES if d != "cuda"])  # both agents would take cuda:0
def test_two_agents_train_the_run_of_one_agent_with_two_processes(
    device_type: str, kind: str, fashion4: Path, tmp_path: Path, one_agent_run: Callable[[str], Path]
) -> None:
    """Exit 0 on both agents, one run folder (named by global rank 0, as train.py names it), the start
    line once for 2 processes, and the weights of one agent running both processes."""
    out = tmp_path / "runs"
    agents = two_agents(kind, train_args(fashion4, out, None, *FLAGS, *device_flags(device_type)), tmp_path / "logs")
    assert [agent.returncode for agent in agents] == [0, 0], "\n".join(agent.stderr[-2000:] for agent in agents)
    stdout = "".join(agent.stdout for agent in agents)
    assert stdout.count("process(es)") == 1 and "2 process(es)" in stdout, stdout
    assert f"on {device_type}" in stdout, stdout
    folders = list(out.iterdir())
    assert len(folders) == 1, folders
    assert_same_weights(weights(folders[0] / "last.pth.tar"), weights(one_agent_run(device_type) / "last.pth.tar"))
