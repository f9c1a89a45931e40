"""The host's load as the cpu budget sees it: other processes' use of this process's cores, read from the
kernel's counters with this process's own time taken out; waiting OpenMP threads told to sleep before torch
loads. Real processes make the load: no counter is faked, except in the arithmetic test, which builds two
readings by hand to check the subtraction exactly."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from tests.conftest import REPO
from vtools.runtime.cpu_budget import usable_cores
from vtools.runtime.host_load import LEAST_WINDOW_S, CoreClock, busy_between, read_clock

SPIN = "import os, sys; os.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True: pass"


@pytest.fixture
def spinners() -> Iterator[int]:
    """One busy-looping process pinned to each core this process may use; the number of cores."""
    cores = usable_cores()
    procs = [subprocess.Popen([sys.executable, "-c", SPIN, str(core)]) for core in cores]
    time.sleep(0.3)  # past their start-up
    yield len(cores)
    for proc in procs:
        proc.kill()
        proc.wait()


def test_the_arithmetic_takes_out_this_process_and_averages_over_the_window() -> None:
    tick = os.sysconf("SC_CLK_TCK")
    start = CoreClock({0: 0, 1: 0, 2: 0}, own_seconds=10.0, at=100.0)
    end = CoreClock({0: 2 * tick, 1: 2 * tick, 2: 2 * tick}, own_seconds=11.0, at=102.0)
    # 4 busy core-seconds on cores 0 and 1 in 2 s, 1 of them this process's: 1.5 cores kept busy by others
    assert busy_between(start, end, [0, 1]) == pytest.approx(1.5)
    # core 2 is not this process's: what runs there does not count
    assert busy_between(start, end, [0]) == pytest.approx(0.5)
    # never more than the cores, never below zero (own time counted on a core outside the set)
    assert busy_between(start, CoreClock({0: 10 * tick}, 10.0, 101.0), [0]) == 1.0
    assert busy_between(start, CoreClock({0: 0}, 13.0, 101.0), [0]) == 0.0


def test_the_kernel_counters_count_every_core_this_process_may_use() -> None:
    clock = read_clock()
    assert clock is not None and set(usable_cores()) <= set(clock.busy_ticks)
    assert clock.own_seconds > 0


def test_processes_spinning_on_every_core_are_seen(spinners: int) -> None:
    # each spinner holds its core; this test's process sleeps through the window, so at least half of
    # each core goes to the spinners whatever else the host runs
    start = read_clock()
    time.sleep(LEAST_WINDOW_S)
    assert busy_between(start, read_clock(), usable_cores()) >= spinners / 2


def test_this_process_own_work_is_not_load() -> None:
    # spin until this process has used half a second of CPU by its own count, however long a busy host takes
    # to give it that; the assertion is in what the kernel counted, never in wall time
    start = read_clock()
    assert start is not None
    spun_from = time.process_time()
    while time.process_time() - spun_from < 0.5:
        pass
    end = read_clock()
    window = end.at - start.at
    own_cores = (end.own_seconds - start.own_seconds) / window
    assert end.own_seconds - start.own_seconds >= 0.45  # the kernel saw the spin (its ticks round down)
    cores = usable_cores()
    total = busy_between(CoreClock(start.busy_ticks, end.own_seconds, start.at), end, cores)  # own time kept in
    rounding = 2 * len(cores) / os.sysconf("SC_CLK_TCK") / window  # a tick on each side of each core
    assert busy_between(start, end, cores) <= max(0.0, total - own_cores) + rounding


@pytest.mark.skipif(len(usable_cores()) < 2, reason="with one core the budget has one thread whatever the load")
def test_a_busy_host_gets_fewer_threads_and_the_start_line_says_why(spinners: int) -> None:
    env = {key: value for key, value in os.environ.items() if key not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY")}
    proc = subprocess.run(
        [sys.executable, "-m", "vtools", "env"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    line = next(line for line in proc.stdout.splitlines() if line.startswith("cpu_budget: "))
    threads = int(line.split(" intra-op")[0].rsplit(", ", 1)[1])
    assert threads < spinners and f"of {spinners} cores busy with other processes at start" in line, line


@pytest.mark.parametrize("policy", [None, "ACTIVE"])
def test_waiting_threads_sleep_unless_the_user_chose(policy: str | None) -> None:
    env = {key: value for key, value in os.environ.items() if key not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    if policy:
        env["OMP_WAIT_POLICY"] = policy
    code = (
        "from vtools.runtime.torch_import import import_torch\n"
        "import_torch()\n"
        "import os\n"
        "print(os.environ['OMP_WAIT_POLICY'])"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == (policy or "PASSIVE")
