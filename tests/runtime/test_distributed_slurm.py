"""``srun python train.py`` without torchrun: SLURM's task variables read as timm reads them, exported as
torchrun's, and a 2-task srun trains exactly as the same run under torchrun."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.conftest import (
    REPO,
    assert_same_weights,
    assert_usage_error,
    free_port,
    run_script,
    summary,
    torchrun,
    train_args,
    weights,
)
from vtools.errors import UsageError
from vtools.runtime.cpu_budget import ranks_on_this_host
from vtools.runtime.distributed import adopt_srun_launch, refuse_torchrun, srun_tasks, srun_tasks_on_this_node

LAUNCH_VARS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "MPI_LOCALRANKID",
    "PMI_RANK",
    "PMI_SIZE",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
)


@pytest.fixture
def launch_env(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """os.environ without any launcher's variables; restored afterwards (adopt_srun_launch writes to it)."""
    saved = dict(os.environ)
    for name in list(os.environ):
        if name in LAUNCH_VARS or name.startswith("SLURM_"):
            del os.environ[name]
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    yield os.environ
    os.environ.clear()
    os.environ.update(saved)


def _slurm(rank: int, tasks: int, local_rank: int, **extra: str) -> dict[str, str]:
    return {"SLURM_PROCID": str(rank), "SLURM_NTASKS": str(tasks), "SLURM_LOCALID": str(local_rank), **extra}


MASTER = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


# ---------------------------------------------------------------- the variables, in process


def test_multi_task_srun_exports_torchruns_variables(launch_env: dict[str, str]) -> None:
    launch_env.update(_slurm(3, 4, 1, SLURM_STEP_TASKS_PER_NODE="2(x2)", SLURM_NODEID="1"), **MASTER)
    assert srun_tasks() == (3, 4, 1)
    adopt_srun_launch()
    assert {k: launch_env.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")} == {
        "RANK": "3",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
    }
    assert ranks_on_this_host() == (1, 2)  # the cpu budget splits the node's cores between its 2 tasks
    assert srun_tasks() is None  # adopted: from here on it is a torchrun-style launch
    adopt_srun_launch()  # and adopting again changes nothing
    assert launch_env["RANK"] == "3"


def test_torchruns_variables_win_over_slurms(launch_env: dict[str, str]) -> None:
    """torchrun started inside an srun step (one torchrun per node): its variables describe the ranks."""
    launch_env.update(_slurm(1, 2, 0), RANK="5", WORLD_SIZE="8", LOCAL_RANK="5", LOCAL_WORLD_SIZE="8")
    assert srun_tasks() is None
    adopt_srun_launch()  # no MASTER_ADDR needed: torchrun's rendezvous is not ours to check
    assert (launch_env["RANK"], launch_env["WORLD_SIZE"], launch_env["LOCAL_RANK"]) == ("5", "8", "5")


def test_single_task_srun_is_a_plain_process(launch_env: dict[str, str]) -> None:
    launch_env.update(_slurm(0, 1, 0))
    assert srun_tasks() is None
    adopt_srun_launch()  # no MASTER_ADDR needed either
    assert not {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"} & set(launch_env)
    refuse_torchrun("validate.py")  # one task may validate


@pytest.mark.parametrize("missing", [("MASTER_ADDR",), ("MASTER_PORT",), ("MASTER_ADDR", "MASTER_PORT")])
def test_missing_master_address_is_one_line(launch_env: dict[str, str], missing: tuple[str, ...]) -> None:
    launch_env.update(_slurm(1, 2, 1), **{k: v for k, v in MASTER.items() if k not in missing})
    with pytest.raises(UsageError) as caught:
        adopt_srun_launch()
    message = str(caught.value)
    assert f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set" in message
    assert "srun started 2 tasks" in message and "export MASTER_ADDR=" in message and "MASTER_PORT=29500" in message
    assert "\n" not in message
    assert "RANK" not in launch_env  # nothing half-adopted


@pytest.mark.parametrize(
    "variables, message",
    [
        ({"SLURM_NTASKS": "abc"}, "SLURM_NTASKS='abc' is not a whole number of 1 or more"),
        ({"SLURM_NTASKS": "0"}, "SLURM_NTASKS='0' is not a whole number of 1 or more"),
        ({"SLURM_PROCID": "-1"}, "SLURM_PROCID='-1' is not a whole number of 0 or more"),
        ({"SLURM_PROCID": "5"}, "SLURM_PROCID=5 is not below SLURM_NTASKS=2 (ranks run from 0 to 1)"),
        ({"SLURM_PROCID": "2"}, "SLURM_PROCID=2 is not below SLURM_NTASKS=2"),
        ({"SLURM_LOCALID": "2"}, "SLURM_LOCALID=2 is not below SLURM_NTASKS=2"),
        # one task whose rank is 1: as wrong as 5 of 2 (it once ran as a plain single process)
        (
            {"SLURM_PROCID": "1", "SLURM_NTASKS": "1", "SLURM_LOCALID": "0"},
            "SLURM_PROCID=1 is not below SLURM_NTASKS=1",
        ),
        ({"PMI_SIZE": "x"}, "PMI_SIZE='x' is not a whole number"),  # read before SLURM_NTASKS, as timm does
    ],
)
def test_launch_variables_no_run_can_use_are_one_line(
    launch_env: dict[str, str], variables: dict[str, str], message: str
) -> None:
    """A task variable that is no whole number ended in int()'s traceback, and a rank outside the tasks waited
    in the rendezvous for ranks that never come, forever and silently: both stop in one line naming them,
    before any export (the MASTER_* are set: the wait was reachable)."""
    launch_env.update(_slurm(1, 2, 1), **MASTER)
    launch_env.update(variables)
    for check in (adopt_srun_launch, lambda: refuse_torchrun("validate.py")):
        with pytest.raises(UsageError) as caught:
            check()
        assert message in str(caught.value) and "\n" not in str(caught.value)
    assert "RANK" not in launch_env


def test_the_last_rank_is_in_range(launch_env: dict[str, str]) -> None:
    launch_env.update(_slurm(1, 2, 1), **MASTER)
    assert srun_tasks() == (1, 2, 1)


def test_validate_and_inference_refuse_a_multi_task_srun(launch_env: dict[str, str]) -> None:
    launch_env.update(_slurm(0, 2, 0))  # refused before MASTER_ADDR would be asked for
    for script in ("validate.py", "inference.py"):
        with pytest.raises(UsageError, match=f"{script} runs in one process, but srun started 2 tasks"):
            refuse_torchrun(script)


def test_tasks_on_this_node(launch_env: dict[str, str]) -> None:
    assert srun_tasks_on_this_node() is None
    launch_env["SLURM_NTASKS_PER_NODE"] = "4"
    assert srun_tasks_on_this_node() == 4
    launch_env.update(SLURM_STEP_TASKS_PER_NODE="4(x2),3", SLURM_NODEID="2")  # the step's own layout wins
    assert srun_tasks_on_this_node() == 3
    launch_env["SLURM_NODEID"] = "1"
    assert srun_tasks_on_this_node() == 4
    launch_env.update(SLURM_STEP_TASKS_PER_NODE="3,2", SLURM_NODEID="1")
    assert srun_tasks_on_this_node() == 2


def test_tasks_srun_bound_keep_their_own_cores(launch_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """srun --cpus-per-task 4 bound each task to its 4 cores: the cpu budget must not split them again."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {4, 5, 6, 7}, raising=False)
    launch_env.update(_slurm(1, 2, 1, SLURM_STEP_TASKS_PER_NODE="2", SLURM_CPUS_PER_TASK="4"), **MASTER)
    adopt_srun_launch()
    assert launch_env["LOCAL_RANK"] == "1" and "LOCAL_WORLD_SIZE" not in launch_env
    assert ranks_on_this_host() == (0, 1)


# ---------------------------------------------------------------- end to end


def _clean_env(**extra: str) -> dict[str, str | None]:
    """For run_script: no launcher's variables from this environment (None removes one), then ``extra``."""
    unset = {k: None for k in os.environ if k in LAUNCH_VARS or k.startswith("SLURM_")}
    return {**unset, "OMP_NUM_THREADS": "1", **extra}


def _full_env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), **_clean_env(**extra)}
    return {k: v for k, v in env.items() if v is not None}


def _srun(args: list[str], tasks: int = 2) -> list[tuple[int, str, str]]:
    """``srun --nodes <tasks> --ntasks-per-node 1 python <args>`` as SLURM starts it, its nodes all this
    host: one process per task, told its place only by SLURM's variables. One task per node makes every
    local rank 0, unlike the global ranks, so a mix-up of the two cannot pass unnoticed."""
    port = str(free_port())
    logs = [(tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")) for _ in range(tasks)]
    procs = [
        subprocess.Popen(
            [sys.executable, *args],
            cwd=REPO,
            env=_full_env(
                **_slurm(rank, tasks, 0, SLURM_STEP_TASKS_PER_NODE=f"1(x{tasks})", SLURM_NODEID=str(rank)),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=port,
            ),
            stdout=logs[rank][0],
            stderr=logs[rank][1],
            text=True,
        )
        for rank in range(tasks)
    ]
    deadline = time.monotonic() + 240
    try:
        # a task that failed leaves the others waiting for it in the rendezvous: stop them too
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            if any(p.poll() for p in procs):
                time.sleep(2)
                break
            time.sleep(0.2)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    results = []
    for proc, files in zip(procs, logs):
        texts = []
        for file in files:
            file.seek(0)
            texts.append(file.read())
            file.close()
        results.append((proc.returncode, *texts))
    return results


@pytest.mark.cpu_only(
    reason="srun only changes how ranks learn their place; 2-rank runs on npu (hccl): tests/scripts/test_train.py"
)
def test_two_srun_tasks_train_as_the_torchrun_run(fashion4: Path, tmp_path: Path) -> None:
    common = ["--device", "cpu", "--epochs", "2", "--batch-size", "16", "--drop", "0.3"]
    results = _srun(train_args(fashion4, tmp_path / "srun", "run", *common))
    assert [code for code, _, _ in results] == [0, 0], [stderr[-2000:] for _, _, stderr in results]
    started = [line for _, stdout, _ in results for line in stdout.splitlines() if line.startswith("training ")]
    assert len(started) == 1 and "2 process(es)" in started[0], started  # one 2-rank run, reported by rank 0
    assert [p.name for p in (tmp_path / "srun").iterdir()] == ["run"]

    reference = run_script(
        torchrun(train_args(fashion4, tmp_path / "torchrun", "run", *common)),
        env=_clean_env(),
        timeout=300,
    )
    assert reference.returncode == 0, reference.stderr[-3000:]
    assert "2 process(es)" in reference.stdout
    columns = ("epoch", "train_loss", "eval_loss", "eval_top1", "eval_samples")
    srun_rows, torchrun_rows = summary(tmp_path / "srun" / "run"), summary(tmp_path / "torchrun" / "run")
    assert [[r[c] for c in columns] for r in srun_rows] == [[r[c] for c in columns] for r in torchrun_rows]
    assert_same_weights(
        weights(tmp_path / "srun" / "run" / "last.pth.tar"), weights(tmp_path / "torchrun" / "run" / "last.pth.tar")
    )


@pytest.mark.cpu_only(reason="launch checks happen before any device work")
def test_srun_launch_errors_are_one_line(custom_images: Path, custom_model_dir: Path, fashion4: Path) -> None:
    no_master = _clean_env(**_slurm(1, 2, 1))
    proc = run_script(train_args(fashion4, Path("/nonexistent"), "run", "--device", "cpu"), env=no_master)
    assert_usage_error(proc, "srun started 2 tasks but MASTER_ADDR and MASTER_PORT are not set", "export MASTER_ADDR=")
    proc = run_script(["inference.py", str(custom_images), "--model", str(custom_model_dir)], env=no_master)
    assert_usage_error(proc, "inference.py runs in one process, but srun started 2 tasks")  # validate.py: in process
