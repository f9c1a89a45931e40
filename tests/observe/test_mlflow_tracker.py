"""MLflow tracking end to end against a real ``mlflow server`` on localhost (SQLite store, proxied artifacts):
what train.py and validate.py log is read back with MlflowClient and compared with the run's own files, and a
server that dies mid-run, or was never there, costs one warning line and a count of what was not logged."""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import (
    DEVICE_TYPES,
    device_flags,
    free_port,
    run_script,
    start_script,
    summary,
    torchrun,
    train_args,
)
from vtools.observe.mlflow_tracker import RUN_ID_TAG
from vtools.observe.tracking import START_SECONDS, TRACKING_FILE

SERVER_START_SECONDS = 90  # `mlflow server` answers /health after 10-15 s on an idle 2-core host
STEP_LINE = re.compile(r"^\S+ \S+ epoch \d+ \(\d+ of \d+\) step \d+/\d+ loss (\S+) ")


# ---------------------------------------------------------------- a real MLflow server


@contextmanager
def mlflow_server(folder: Path) -> Iterator[tuple[str, subprocess.Popen]]:
    """``mlflow server`` on a free port with its SQLite store and artifacts in ``folder``, up (its /health
    answers) when this yields its URI; stopped with its workers (its own session, its process group) after."""
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    command = [
        *(sys.executable, "-m", "mlflow", "server"),
        *("--backend-store-uri", f"sqlite:///{folder / 'm.db'}"),
        *("--artifacts-destination", str(folder / "artifacts")),
        *("--host", "127.0.0.1", "--port", str(port), "--workers", "1"),
    ]
    log = (folder / "server.log").open("w")
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    uri = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(uri, proc, folder / "server.log")
        yield uri, proc
    finally:
        stop_group(proc)
        log.close()


def wait_healthy(uri: str, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + SERVER_START_SECONDS
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"mlflow server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{uri}/health", timeout=5) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    pytest.fail(f"mlflow server not up within {SERVER_START_SECONDS} s:\n{log.read_text()[-3000:]}")


def stop_group(proc: subprocess.Popen, sig: int = signal.SIGTERM) -> None:
    """Stop the server and its workers (its process group); SIGKILL what is still there after 15 s."""
    try:
        os.killpg(proc.pid, sig)
        proc.wait(timeout=15)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=15)
    try:  # workers that outlived their parent
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@pytest.fixture(scope="module")
def mlflow_uri(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with mlflow_server(tmp_path_factory.mktemp("mlflow_server")) as (uri, _):
        yield uri


# ---------------------------------------------------------------- reading a run back


def client(uri: str) -> Any:
    from mlflow import MlflowClient

    return MlflowClient(uri)


def only_run(uri: str, experiment: str) -> Any:
    """The one MLflow run of ``experiment`` (fails when there are none or several)."""
    mlflow = client(uri)
    found = mlflow.get_experiment_by_name(experiment)
    assert found is not None, f"no experiment {experiment}"
    runs = mlflow.search_runs([found.experiment_id])
    assert len(runs) == 1, [(run.info.run_name, run.data.tags.get(RUN_ID_TAG)) for run in runs]
    return runs[0]


def history(uri: str, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client(uri).get_metric_history(run_id, key))


def csv_histories(rows: list[dict[str, str]]) -> dict[str, list[tuple[int, float]]]:
    """Every numeric summary.csv column as (epoch, value) pairs, its empty cells left out."""
    columns = [column for column in rows[0] if column != "epoch"]
    return {
        column: [(int(row["epoch"]), float(row[column])) for row in rows if row[column] != ""] for column in columns
    }


def step_losses(stdout: str) -> list[str]:
    """The losses of the printed log-step lines, as printed (4 decimals)."""
    return [match.group(1) for line in stdout.splitlines() if (match := STEP_LINE.match(line))]


def artifact_files(uri: str, run_id: str, path: str) -> set[str]:
    return {entry.path for entry in client(uri).list_artifacts(run_id, path) if not entry.is_dir}


def assert_run_matches(uri: str, run: Any, folder: Path, printed_losses: list[str]) -> None:
    """The MLflow run's histories are summary.csv's columns and the printed log steps, its end metrics the
    best epoch's."""
    rows = summary(folder)
    run_id = run.info.run_id
    for column, expected in csv_histories(rows).items():
        assert history(uri, run_id, column) == expected, column
    logged = [f"{value:.4f}" for _, value in history(uri, run_id, "step/loss")]
    assert logged == printed_losses
    for key in ("step/lr", "step/img_per_sec", "step/data_wait"):
        assert len(history(uri, run_id, key)) == len(printed_losses), key
    metrics = run.data.metrics
    assert metrics["epochs"] == len(rows)
    best = max(float(row["eval_top1"]) for row in rows)
    assert metrics["best_top1"] == best
    assert float(rows[int(metrics["best_epoch"])]["eval_top1"]) == best


# ---------------------------------------------------------------- train.py, its resume, validate.py


@pytest.mark.slow
@pytest.mark.parametrize("device_type", DEVICE_TYPES)
def test_training_run_resume_and_validation_are_logged_as_the_files_say(
    device_type: str, mlflow_uri: str, fashion4: Path, tmp_path: Path
) -> None:
    """Every summary.csv column is a metric history with the epochs as steps, every printed log step a
    step/* point; a resume continues the same MLflow run; validate.py logs its results row."""
    experiment = f"train-{device_type}-{uuid.uuid4().hex[:8]}"
    tracked = ["--log-mlflow", mlflow_uri, "--mlflow-experiment", experiment, "--log-interval", "2"]
    common = [*device_flags(device_type), *tracked, "--mlflow-artifacts"]
    first = run_script(train_args(fashion4, tmp_path, "run", *common, "--epochs", "1"))
    assert first.returncode == 0, first.stderr[-3000:]
    folder = tmp_path / "run"
    assert f"tracking: MLflow ({mlflow_uri})" in first.stdout
    assert "not logged to MLflow" not in first.stdout and "warning: MLflow" not in first.stdout
    assert "View run" not in first.stdout  # MLflow's own URL lines stay out of the run's output
    tracking_id = json.loads((folder / TRACKING_FILE).read_text())["id"]
    run = only_run(mlflow_uri, experiment)
    first_losses = step_losses(first.stdout)
    assert first_losses and len(summary(folder)) == 1
    assert_run_matches(mlflow_uri, run, folder, first_losses)
    assert run.info.run_name == "run" and run.info.status == "FINISHED"
    assert run.data.params["model"] == "test_resnet"
    tags = run.data.tags
    assert tags[RUN_ID_TAG] == tracking_id and tags["model"] == "test_resnet"
    assert tags["device"].split(":")[0] == device_type
    for name in ("model", "eval"):
        files = {f"{name}/{path.name}" for path in (folder / name).iterdir() if path.is_file()}
        assert files and artifact_files(mlflow_uri, run.info.run_id, name) == files, name

    resumed = run_script(train_args(fashion4, tmp_path, "run", *common, "--epochs", "2", "--resume", "auto"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    again = only_run(mlflow_uri, experiment)  # the same run, not a second one
    assert again.info.run_id == run.info.run_id and again.data.tags[RUN_ID_TAG] == tracking_id
    assert again.info.status == "FINISHED" and len(summary(folder)) == 2
    assert_run_matches(mlflow_uri, again, folder, first_losses + step_losses(resumed.stdout))

    results = tmp_path / "r.csv"
    validation = f"validate-{device_type}-{uuid.uuid4().hex[:8]}"
    checked = run_script(
        [
            *("validate.py", str(fashion4 / "val"), "--model", str(folder / "model"), *device_flags(device_type)),
            *("--batch-size", "32", "--workers", "1", "--results-file", str(results)),
            *("--log-mlflow", mlflow_uri, "--mlflow-experiment", validation),
        ]
    )
    assert checked.returncode == 0, checked.stderr[-3000:]
    assert "warning: MLflow" not in checked.stdout and "not logged to MLflow" not in checked.stdout
    with results.open(newline="") as handle:
        (row,) = list(csv.DictReader(handle))
    logged = only_run(mlflow_uri, validation)
    assert logged.info.run_name == f"validate {row['model']}" and logged.info.status == "FINISHED"
    for key in ("top1", "top5", "loss", "samples"):
        assert logged.data.metrics[key] == float(row[key]), key
    assert logged.data.tags["vtools.command"] == "validate"
    assert logged.data.tags["device"].split(":")[0] == device_type


@pytest.mark.slow
@pytest.mark.parametrize("device_type", DEVICE_TYPES)
def test_two_ranks_log_one_run_from_rank_0(device_type: str, mlflow_uri: str, fashion4: Path, tmp_path: Path) -> None:
    """Under torchrun only rank 0 tracks: one MLflow run, whose histories are the run's summary.csv (its
    metrics reduced over the ranks) and whose step points are rank 0's printed log steps."""
    experiment = f"torchrun-{device_type}-{uuid.uuid4().hex[:8]}"
    tracked = ["--log-mlflow", mlflow_uri, "--mlflow-experiment", experiment, "--log-interval", "2"]
    args = train_args(fashion4, tmp_path, "ranks", *device_flags(device_type), *tracked, "--epochs", "1")
    proc = run_script(torchrun(args), env={"OMP_NUM_THREADS": "1"}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("tracking: MLflow") == 1 and "not logged" not in proc.stdout
    assert_run_matches(mlflow_uri, only_run(mlflow_uri, experiment), tmp_path / "ranks", step_losses(proc.stdout))


# ---------------------------------------------------------------- a server that dies mid-run


def db_history(db: Path, key: str) -> list[tuple[int, float]]:
    """A metric's history straight from the server's SQLite store (the server is gone)."""
    with sqlite3.connect(db) as connection:
        return sorted(connection.execute("SELECT step, value FROM metrics WHERE key = ?", (key,)).fetchall())


def wait_for(predicate: Any, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, f"not within {seconds} s: {what}"
        time.sleep(0.2)


@pytest.mark.slow
@pytest.mark.cpu_only(reason="the tracker and its server are host-side: the device changes nothing they do")
def test_a_server_killed_mid_run_costs_one_warning_and_the_run_finishes(fashion4: Path, tmp_path: Path) -> None:
    """The MLflow server is killed once epoch 0's row is logged: the run trains on and exits 0, says one
    warning line, and its last line counts what was not logged; the store keeps the history up to the
    failure, without holes."""
    experiment, epochs = "killed", 20  # epochs enough that the run cannot end before the kill on an idle host
    with mlflow_server(tmp_path / "server") as (uri, server):
        args = train_args(fashion4, tmp_path, "run", "--device", "cpu", "--epochs", str(epochs), "--log-interval", "2")
        stderr = (tmp_path / "stderr.txt").open("w")
        proc = start_script([*args, "--log-mlflow", uri, "--mlflow-experiment", experiment], stderr=stderr)
        lines: list[str] = []
        epoch_0 = threading.Event()

        def read() -> None:
            for line in proc.stdout:
                lines.append(line.rstrip("\n"))
                if line.startswith("epoch 0:"):
                    epoch_0.set()

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            assert epoch_0.wait(timeout=300), "\n".join(lines)
            run_id = only_run(uri, experiment).info.run_id
            wait_for(lambda: history(uri, run_id, "train_loss"), 60, "epoch 0's row logged")
            stop_group(server, signal.SIGKILL)
            code = proc.wait(timeout=300)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            reader.join(timeout=30)
            stderr.close()
    err = (tmp_path / "stderr.txt").read_text()
    assert code == 0, err[-3000:]
    warnings = [line for line in lines if line.startswith("warning: MLflow")]
    assert len(warnings) == 1, lines
    assert f"MLflow ({uri}): not logging from epoch " in warnings[0], warnings
    rows = summary(tmp_path / "run")
    assert len(rows) == epochs
    db = tmp_path / "server" / "m.db"
    logged_rows = len(db_history(db, "train_loss"))
    assert 1 <= logged_rows < epochs
    for column, expected in csv_histories(rows).items():  # the columns up to the failure: no holes
        assert db_history(db, column) == expected[:logged_rows], column
    logged_steps = len(db_history(db, "step/loss"))
    not_logged_steps = len(step_losses("\n".join(lines))) - logged_steps
    last = lines[-1]
    assert last.startswith(f"not logged to MLflow ({uri}): "), lines[-5:]
    said = re.search(r": (?:(\d+) log step\(s\), )?(\d+) epoch row\(s\), the run's end", last)
    assert said, last
    # the call the server died in may have been stored before its answer was lost: counted as not logged
    extra = (int(said.group(1) or 0) - not_logged_steps, int(said.group(2)) - (epochs - logged_rows))
    assert extra in ((0, 0), (1, 0), (0, 1)), (extra, last)


# ---------------------------------------------------------------- a server that is not there


@pytest.mark.cpu_only(reason="the tracker is host-side; validate.py's devices: tests/scripts/test_validate.py")
def test_validation_with_no_server_writes_its_results_and_says_what_was_not_logged(
    custom_images: Path, custom_model_dir: Path, tmp_path: Path
) -> None:
    """A URI nobody listens on: validate.py writes its results as without MLflow, in a time bounded by the
    tracker's start, says one warning line and ends with what was not logged. Its own process, as a user
    runs it: in process, in a loaded full tier, the failed start twice outlasted its 60 s (not seen alone)."""
    uri = f"http://127.0.0.1:{free_port()}"
    results = tmp_path / "r.csv"
    flags = [str(custom_images), "--model", str(custom_model_dir), "--device", "cpu", "--workers", "0"]
    began = time.monotonic()
    proc = run_script(["validate.py", *flags, "--results-file", str(results), "--log-mlflow", uri])
    seconds = time.monotonic() - began
    assert proc.returncode == 0, proc.stderr
    # a hang bound: the tracker's own start bound and two generous minutes for the validation itself (6 s
    # alone); MLflow's default retries against a dead server take longer
    assert seconds < START_SECONDS + 120, seconds
    lines = proc.stdout.splitlines()
    with results.open(newline="") as handle:
        (row,) = list(csv.DictReader(handle))
    assert float(row["samples"]) == 12
    warnings = [line for line in lines if line.startswith("warning: MLflow")]
    assert len(warnings) == 1 and f"MLflow ({uri}): not logging from the start on (could not start" in warnings[0]
    assert lines[-1].startswith(f"not logged to MLflow ({uri}): 1 validation result(s), the run's end"), lines[-3:]
