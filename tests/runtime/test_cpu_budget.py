"""The cpu budget: who gets the host's cores, decided from the core count and the device, applied to torch,
shown at the run's start and in ``vtools env``, and overridable; core binding for torchrun ranks.

Every test runs on cpu and the emulated npu: the two device rows split the cores differently (the model
computes on the host's cores on cpu; an accelerator leaves them to decoding), so each body states the
rule and checks it for the device at hand.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.conftest import device_flags, run_script, train_args
from vtools.data.loaders import make_loader
from vtools.runtime.cpu_budget import plan, rank_slice, setup_cpu_budget, usable_cores
from vtools.runtime.device import kind_of


@pytest.fixture(autouse=True)
def _restore_threads_and_affinity() -> Iterator[None]:
    """The budget changes process-wide settings; every test leaves them as it found them."""
    threads, cores = torch.get_num_threads(), usable_cores()
    yield
    torch.set_num_threads(threads)
    os.sched_setaffinity(0, cores)


def expected_split(device_type: str, cores: int, busy: float = 0.0) -> tuple[int, int]:
    """(workers, intra-op threads) as the README states the rule, with ``busy`` cores taken by other processes."""
    free = max(1, int(cores - busy + 0.5))
    if device_type == "cpu":
        return max(1, min(8, cores // 4)), min(cores, free)
    workers = max(1, min(8, cores - 1))
    return workers, max(1, min(cores - workers, free))


@pytest.mark.parametrize("cores", [1, 2, 4, 16, 96])
def test_default_split_follows_the_device(device: torch.device, cores: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    budget = plan(device.type, cores)
    assert (budget.workers, budget.threads) == expected_split(device.type, cores)
    assert budget.interop_threads == 1
    assert budget.pin_thread == (not kind_of(device.type).computes_on_host)
    assert budget.decode_during_validation == (not kind_of(device.type).computes_on_host)


@pytest.mark.parametrize(("cores", "busy"), [(2, 0.4), (2, 0.6), (2, 1.9), (16, 3.5), (16, 16.0)])
def test_busy_cores_take_intra_op_threads_not_workers(
    device: torch.device, cores: int, busy: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    budget = plan(device.type, cores, busy=busy)
    assert (budget.workers, budget.threads) == expected_split(device.type, cores, busy)
    assert plan(device.type, cores, threads=cores, busy=busy).threads == cores  # --threads wins
    noted = f"({busy:.1f} of {cores} cores busy with other processes at start)" in budget.describe()
    assert noted == (busy >= 0.5)


def test_budget_is_applied_and_reaches_the_loaders(device: torch.device, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    budget = setup_cpu_budget(device)
    assert (budget.workers, budget.threads) == expected_split(device.type, len(usable_cores()), budget.busy)
    assert torch.get_num_threads() == budget.threads
    assert budget.kept_freed_memory == (os.uname().sysname == "Linux")
    loader = make_loader(list(range(8)), 2, device)  # no worker count given: the budget's
    assert loader.num_workers == budget.workers


def test_flags_and_omp_num_threads_override(device: torch.device, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert setup_cpu_budget(device).threads == 3
    assert torch.get_num_threads() == 3
    budget = setup_cpu_budget(device, workers=0, threads=1)
    assert (budget.workers, budget.threads, budget.pin_thread) == (0, 1, False)
    assert torch.get_num_threads() == 1


@pytest.mark.parametrize(("cores", "asked", "workers"), [(2, 4, 2), (2, 2, 2), (16, 4, 4), (1, 8, 1), (4, 0, 0)])
def test_workers_are_cut_to_the_cores(device: torch.device, cores: int, asked: int, workers: int) -> None:
    """A timm args.yaml's ``workers: 4`` on a 2-core host made torch warn of a stall (4 worker processes, max 2):
    given workers, from the command line or a config, stop at the cores this process may use, and say so."""
    budget = plan(device.type, cores, workers=asked)
    assert budget.workers == workers
    cut = f"{workers} loader worker{'s' * (workers != 1)} (--workers {asked} cut to the {cores} cores this"
    assert (cut in budget.describe()) == (asked > cores), budget.describe()


def test_torchrun_ranks_share_the_cores(device: torch.device, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under torchrun each rank plans with its share of the host's cores; --bind-cores pins it there."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("CPU_AFFINITY_CONF", raising=False)
    cores = usable_cores()
    if len(cores) < 2:
        pytest.skip("needs 2 cores to split between 2 ranks")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    share = len(cores) // 2
    assert setup_cpu_budget(device).cores == share
    budget = setup_cpu_budget(device, bind=True)
    assert budget.bound == tuple(cores[share : 2 * share])
    assert sorted(os.sched_getaffinity(0)) == cores[share : 2 * share]
    assert rank_slice(list(range(8)), 1, 2) == [4, 5, 6, 7] and rank_slice(list(range(9)), 2, 3) == [6, 7, 8]


def test_a_backend_affinity_variable_takes_precedence(device: torch.device, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ascend's CPU_AFFINITY_CONF (named in the npu row) binds torch_npu's threads: vtools then binds
    nothing and says so; on a device without such a variable --bind-cores binds."""
    monkeypatch.setenv("CPU_AFFINITY_CONF", "1")
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    budget = setup_cpu_budget(device, bind=True)
    if kind_of(device.type).affinity_env == "CPU_AFFINITY_CONF":
        assert budget.bound is None and "CPU_AFFINITY_CONF=1" in budget.describe()
    else:
        assert budget.bound == tuple(usable_cores()) and "CPU_AFFINITY_CONF" not in budget.describe()


def test_start_line_and_env_report_the_budget(device: torch.device, fashion4: Path, tmp_path: Path) -> None:
    env = run_script(["-m", "vtools", "env", *device_flags(device.type)], env={"OMP_NUM_THREADS": ""})
    assert env.returncode == 0, env.stderr
    busy = re.search(r"\(([0-9.]+) of \d+ cores busy", env.stdout)  # other tests running beside this one
    workers, threads = expected_split(device.type, len(usable_cores()), float(busy.group(1)) if busy else 0.0)
    line = f"{workers} loader worker{'s' * (workers != 1)}, {threads} intra-op + 1 inter-op threads"
    assert f"cpu_budget: {len(usable_cores())} cores, {line}" in env.stdout
    proc = run_script(
        [
            *train_args(fashion4, tmp_path, "run", "--epochs", "1", "--threads", "1", "--workers", "0"),
            *device_flags(device.type),
        ],
        env={"OMP_NUM_THREADS": ""},
    )
    assert proc.returncode == 0, proc.stderr
    assert "cpu budget: " in proc.stdout and "0 loader workers, 1 intra-op + 1 inter-op threads" in proc.stdout
