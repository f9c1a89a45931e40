"""A run deletes or replaces only what it wrote, resumes only the experiment it saved, and never reports a
broken run as a result: each case as a user runs it, on every device where a device is involved."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import (
    REPO,
    assert_one_line_error,
    assert_usage_error,
    device_flags,
    fashion_subset,
    run_script,
    summary,
    train_args,
    write_model_folder,
)
from tests.terminal import close_terminal_after


def _one_epoch(data: Path, out: Path, name: str, *extra: str) -> list[str]:
    return train_args(data, out, name, "--epochs", "1", *extra)


# ---------------------------------------------------------------- never delete or overwrite what the run did not make


@pytest.mark.cpu_only(reason="the folder is settled before any device work; the same code runs for every device")
def test_a_users_own_config_in_the_run_folder_is_never_deleted_or_overwritten(fashion4: Path, tmp_path: Path) -> None:
    folder = tmp_path / "runs" / "exp1"
    folder.mkdir(parents=True)
    own = folder / "config.yaml"
    own.write_text(
        "# my experiment: keep this comment\n"
        f"experiment: exp1\noutput: {tmp_path / 'runs'}\ndata-dir: {tmp_path / 'typo'}\nmodel: test_resnet\n"
        "img-size: 32\nbatch-size: 32\nworkers: 1\nepochs: 1\n"
    )
    text = own.read_text()
    failed = run_script(["train.py", "-c", str(own)])
    assert_usage_error(failed, str(tmp_path / "typo"))
    assert sorted(p.name for p in folder.iterdir()) == ["config.yaml"] and own.read_text() == text

    proc = run_script(["train.py", "-c", str(own), "--data-dir", str(fashion4)])
    assert proc.returncode == 0, proc.stderr
    assert own.read_text() == text, "the user's config.yaml was written over"
    resolved = (folder / "args.yaml").read_text()
    assert "data_dir:" in resolved and str(fashion4) in resolved
    assert f"{own} was not written by a vtools run" in proc.stdout
    assert (folder / "model" / "model.safetensors").is_file()


@pytest.mark.cpu_only(reason="the folder is settled before any device work; the same code runs for every device")
def test_a_failed_start_removes_only_what_it_created(fashion4: Path, tmp_path: Path) -> None:
    """In a folder the run made, nothing is left; in one the user made, the folder and their files stay."""
    made = run_script(_one_epoch(tmp_path / "missing", tmp_path / "out", "new"))
    assert_usage_error(made)
    assert not (tmp_path / "out" / "new").exists()

    mine = tmp_path / "out" / "mine"
    mine.mkdir(parents=True)
    (mine / "notes.txt").write_text("mine")
    kept = run_script(_one_epoch(tmp_path / "missing", tmp_path / "out", "mine"))
    assert_usage_error(kept)
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"]


def test_finishing_a_resumed_run_keeps_files_the_user_put_in_model(
    device: torch.device, fashion4: Path, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    first = run_script(_one_epoch(fashion4, tmp_path, "run", *device_flags(device.type)))
    assert first.returncode == 0, first.stderr
    exported = run / "model" / "model.onnx"
    exported.write_bytes(b"an exported model")
    (run / "model" / "notes.txt").write_text("my note")
    before = (run / "model" / "model.safetensors").stat().st_ino

    resumed = run_script(
        [*_one_epoch(fashion4, tmp_path, "run", *device_flags(device.type)), "--resume", "auto", "--epochs", "2"]
    )
    assert resumed.returncode == 0, resumed.stderr
    assert exported.read_bytes() == b"an exported model" and (run / "model" / "notes.txt").read_text() == "my note"
    assert "also holds model.onnx, notes.txt, which this run did not write" in resumed.stdout
    assert (run / "model" / "model.safetensors").stat().st_ino != before  # exported again, renamed into place
    modes = {(run / name).stat().st_mode & 0o777 for name in ("last.pth.tar", "model/model.safetensors", "model")}
    assert modes <= {0o644, 0o755}, modes  # shared like the checkpoints, not 0600/0700


def test_a_requeue_right_after_kill_9_is_never_refused(device: torch.device, fashion4: Path, tmp_path: Path) -> None:
    """The folder lock dies with the run's main process, even while its orphaned loader workers live on."""
    from vtools.train.run_lock import holds_ended_run

    command = [
        sys.executable,
        *train_args(fashion4, tmp_path, "run", "--epochs", "50", "--workers", "2", *device_flags(device.type)),
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with subprocess.Popen(
        command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    ) as proc:
        for line in proc.stdout:
            if line.startswith("epoch 1:"):  # epoch 0's checkpoint is on disk once epoch 1 has saved
                break
        workers = [int(pid) for pid in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()]
        proc.kill()
        proc.wait()
        assert workers and any(Path(f"/proc/{pid}").exists() for pid in workers), "no orphaned worker to test with"
        assert holds_ended_run(tmp_path / "run"), "the lock outlived the killed run"
    resumed = run_script(
        [*train_args(fashion4, tmp_path, "run", "--epochs", "2", *device_flags(device.type)), "--resume", "auto"]
    )
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from" in resumed.stdout


@pytest.mark.cpu_only(reason="stale files are removed before any device work")
def test_temporary_files_of_a_killed_writer_are_removed_by_the_next_run(fashion4: Path, tmp_path: Path) -> None:
    first = run_script(_one_epoch(fashion4, tmp_path, "run"))
    assert first.returncode == 0, first.stderr
    stale = tmp_path / "run" / ".last.pth.tar.k1ll3d.tmp"
    stale.write_bytes(b"half a checkpoint")
    theirs = tmp_path / "run" / ".my-own.tmp"
    theirs.write_text("not vtools'")
    resumed = run_script([*_one_epoch(fashion4, tmp_path, "run"), "--resume", "auto", "--epochs", "2"])
    assert resumed.returncode == 0, resumed.stderr
    assert not stale.exists() and theirs.read_text() == "not vtools'"


def test_sigterm_after_the_last_epoch_still_finishes_the_run(
    device: torch.device, fashion4: Path, tmp_path: Path
) -> None:
    command = [sys.executable, *_one_epoch(fashion4, tmp_path, "run", *device_flags(device.type))]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with subprocess.Popen(
        command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as proc:
        for line in proc.stdout:
            if line.startswith("epoch 0:"):
                proc.send_signal(signal.SIGTERM)
                break
        out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    run = tmp_path / "run"
    assert torch.load(run / "last.pth.tar", weights_only=True)["epoch"] == 1
    assert (run / "model" / "model.safetensors").is_file()
    assert not list(run.glob(".*.tmp"))


# ---------------------------------------------------------------- resume continues the same experiment


@pytest.fixture
def one_epoch_run(fashion4: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A one-epoch run on a copy of the 4-class set (the copy may be changed by the test)."""
    data = tmp_path / "data"
    shutil.copytree(fashion4, data)
    proc = run_script(_one_epoch(data, tmp_path, "run"))
    assert proc.returncode == 0, proc.stderr
    return data, tmp_path


@pytest.mark.cpu_only(reason="the comparison happens before any training step; the same code for every device")
@pytest.mark.parametrize(
    "change, extra, fragments",
    [
        ("lr", ["--lr", "0.05"], ["--lr 0.005 -> 0.05"]),
        ("batch", ["--batch-size", "16"], ["global batch", "32 x 1 -> 16 x 1"]),
        ("seed", ["--seed", "7"], ["--seed 42 -> 7"]),
        ("renamed class", [], ["class names (sneaker -> shoe)"]),
        ("deleted image", [], ["training images 240 -> 239"]),
    ],
)
def test_a_resume_that_changes_the_experiment_is_refused_naming_the_difference(
    one_epoch_run: tuple[Path, Path], change: str, extra: list[str], fragments: list[str]
) -> None:
    data, out = one_epoch_run
    if change == "renamed class":
        (data / "train" / "sneaker").rename(data / "train" / "shoe")
        (data / "val" / "sneaker").rename(data / "val" / "shoe")
    if change == "deleted image":
        next((data / "train" / "bag").iterdir()).unlink()
    proc = run_script([*_one_epoch(data, out, "run", *extra), "--resume", "auto", "--epochs", "2"])
    assert_usage_error(proc, "--resume", "changes the run it continues", *fragments)
    assert len(summary(out / "run")) == 1


@pytest.mark.cpu_only(reason="the comparison happens before any training step; the same code for every device")
def test_a_resume_may_change_where_it_runs_and_how_long(one_epoch_run: tuple[Path, Path]) -> None:
    data, out = one_epoch_run
    proc = run_script(
        [*_one_epoch(data, out, "run", "--workers", "0", "--log-interval", "3"), "--resume", "auto", "--epochs", "2"]
    )
    assert proc.returncode == 0, proc.stderr
    assert "--epochs 2 (the run had 1)" in proc.stdout
    assert [row["epoch"] for row in summary(out / "run")] == ["0", "1"]


def test_the_start_line_shows_the_rate_used_and_a_warm_up_that_does_not_fit(
    device: torch.device, fashion4: Path, tmp_path: Path
) -> None:
    proc = run_script(
        _one_epoch(
            fashion4, tmp_path, "run", "--warmup-epochs", "5", "--warmup-lr", "0.0001", *device_flags(device.type)
        )
    )
    assert proc.returncode == 0, proc.stderr
    assert "lr 0.0001 now (0.005 at its peak)" in proc.stdout
    assert "warning: --warmup-epochs 5 is not shorter than this run's 1 epoch(s)" in proc.stdout
    assert math.isclose(float(summary(tmp_path / "run")[0]["lr"]), 0.0001)


# ---------------------------------------------------------------- a broken run is a failure, never a result


def test_an_epoch_that_evaluates_to_nan_fails_and_is_never_kept(
    device: torch.device, fashion4: Path, tmp_path: Path
) -> None:
    """Starting weights with a NaN BatchNorm statistic train with finite losses (training uses the batch's
    statistics) but evaluate to NaN: the run must stop at that epoch (exit 3) and keep no checkpoint of it."""
    import timm
    from safetensors.torch import save_file

    torch.manual_seed(0)
    state = timm.create_model("test_resnet", num_classes=4).state_dict()
    next(value for key, value in state.items() if key.endswith("running_var")).fill_(float("nan"))
    save_file(state, tmp_path / "start.safetensors")
    proc = run_script(
        _one_epoch(
            fashion4,
            tmp_path,
            "run",
            "--initial-checkpoint",
            str(tmp_path / "start.safetensors"),
            *device_flags(device.type),
        )
    )
    assert_one_line_error(proc, 3, "epoch 0", "not saved")
    assert not list((tmp_path / "run").glob("*.pth.tar")) if (tmp_path / "run").exists() else True


def test_an_epoch_with_non_finite_weights_or_eval_loss_is_refused() -> None:
    from vtools.errors import RunFailed
    from vtools.evaluation.loops import EvalResult
    from vtools.train.run import check_finite

    model = torch.nn.BatchNorm2d(3)
    good = EvalResult(top1=50.0, top5=100.0, loss=0.5, count=10, seconds=1.0)
    check_finite(0, good, model)
    with pytest.raises(RunFailed, match="eval loss is nan"):
        check_finite(0, EvalResult(top1=10.0, top5=50.0, loss=float("nan"), count=10, seconds=1.0), model)
    model.running_var[1] = float("inf")
    with pytest.raises(RunFailed, match="weights hold non-finite values"):
        check_finite(3, good, model)


@pytest.mark.parametrize("fmt", ["json", "jsonl", "csv"])
def test_results_files_never_hold_a_bare_nan(tmp_path: Path, fmt: str) -> None:
    import pandas

    from vtools.results import write_rows

    path = write_rows(
        tmp_path / f"r.{fmt}", [{"model": "m", "loss": float("nan"), "top1": 1.5, "p": [float("inf")]}], fmt
    )
    text = path.read_text()
    assert "NaN" not in text and "Infinity" not in text
    if fmt != "csv":
        row = json.loads(text.splitlines()[0] if fmt == "jsonl" else text)
        row = row if fmt == "jsonl" else row[0]
        assert row["loss"] is None and row["p"] == [None] and row["top1"] == 1.5
    frame = pandas.read_csv(path) if fmt == "csv" else pandas.read_json(path, lines=fmt == "jsonl")
    assert math.isnan(frame["loss"][0]) and frame["top1"][0] == 1.5


def test_a_model_folder_whose_std_is_zero_is_refused(device: torch.device, fashion4: Path, tmp_path: Path) -> None:
    folder = write_model_folder(tmp_path / "model", 4)
    config = json.loads((folder / "config.json").read_text())
    config["pretrained_cfg"]["std"] = [0, 0, 0]
    (folder / "config.json").write_text(json.dumps(config))
    proc = run_script(
        [
            "validate.py",
            str(fashion4),
            "--model",
            str(folder),
            "--results-file",
            str(tmp_path / "r.json"),
            "--results-format",
            "json",
            *device_flags(device.type),
        ]
    )
    assert_usage_error(proc, "std", "not 0")
    assert not (tmp_path / "r.json").exists()


# ---------------------------------------------------------------- run folders a run cannot use as they are (issue 33)


@pytest.mark.cpu_only(reason="the folder is settled before any device work; the same code runs for every device")
def test_a_damaged_lock_that_a_live_run_holds_is_refused_as_that_runs(fashion4: Path, tmp_path: Path) -> None:
    """A lock file's contents prove nothing; the kernel's record lock does: held by a live process (this
    test's), a folder with a damaged lock is refused as a running run's, never taken over."""
    import fcntl

    folder = tmp_path / "run"
    folder.mkdir()
    lock = folder / ".vtools-run.lock"
    lock.write_bytes(b"\x9b\xfe not a pid \x00\n")
    with open(lock, "a") as held:
        fcntl.lockf(held.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        for extra in ([], ["--resume", "auto"]):
            proc = run_script(_one_epoch(fashion4, tmp_path, "run", "--device", "cpu", *extra))
            assert_usage_error(proc, f"{folder} belongs to a training run that is still going (pid unknown)")
    assert lock.read_bytes() == b"\x9b\xfe not a pid \x00\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


@pytest.mark.cpu_only(reason="the folder is settled before any device work; the same code runs for every device")
def test_a_folder_an_earlier_run_left_without_a_checkpoint_is_not_offered_to_continue(
    fashion4: Path, tmp_path: Path
) -> None:
    """What a run killed before its first checkpoint leaves (its lock naming the config.yaml it wrote): a new
    run leaves it alone and says there is nothing to continue; --resume auto starts from scratch there."""
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / ".vtools-run.lock").write_text("4242\nconfig.yaml\n")
    (folder / "config.yaml").write_text("model: test_resnet\n")
    proc = run_script(_one_epoch(fashion4, tmp_path, "run", "--device", "cpu"))
    assert proc.returncode == 0, proc.stderr
    assert f"{folder} holds files of an earlier run that saved no checkpoint" in proc.stdout
    assert "would continue" not in proc.stdout
    assert (tmp_path / "run-2" / "last.pth.tar").is_file()
    resumed = run_script([*_one_epoch(fashion4, tmp_path, "run", "--device", "cpu"), "--resume", "auto"])
    assert resumed.returncode == 0, resumed.stderr
    assert f"--resume auto: no checkpoint in {folder} yet, starting from scratch" in resumed.stdout


def _close_its_terminal_after_epoch_0(args: list[str], log: bool) -> tuple[int, str]:
    """Run train.py ``args`` in a terminal of its own (stdout there too, or with ``log`` into a log) and
    close it once epoch 0 is reported. Returns the exit code and the log."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    code, seen, out = close_terminal_after([sys.executable, *args], "epoch 0: train_loss", log, env)
    assert "epoch 0: train_loss" in seen, seen[-2000:]
    return code, out


def test_a_terminal_that_closes_stops_the_run_with_a_checkpoint_to_continue(
    device: torch.device, fashion4: Path, tmp_path: Path
) -> None:
    """The terminal a run was started in closes mid-run: its pty hangs up, SIGHUP goes to the run and its
    loader workers, and every later write to the terminal fails. The run saves a checkpoint and exits 129
    (not killed, not stopped by a failed print); --resume auto then finishes the run."""
    args = train_args(fashion4, tmp_path, "run", "--epochs", "4", "--workers", "1", *device_flags(device.type))
    code, _ = _close_its_terminal_after_epoch_0(args, log=False)
    assert code == 129
    run = tmp_path / "run"
    assert 1 <= torch.load(run / "last.pth.tar", map_location="cpu", weights_only=True)["epoch"] < 4
    resumed = run_script([*args, "--resume", "auto"])
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from" in resumed.stdout
    assert [int(row["epoch"]) for row in summary(run)] == [0, 1, 2, 3]


@pytest.mark.cpu_only(reason="what the log says; the checkpoint on each device: the test above")
def test_a_terminal_that_closes_is_said_in_the_log(fashion4: Path, tmp_path: Path) -> None:
    """stdout into a log file, the terminal closed: the log names the stop and where the checkpoint is."""
    code, log = _close_its_terminal_after_epoch_0(
        train_args(fashion4, tmp_path, "run", "--epochs", "4", "--workers", "1", "--device", "cpu"), log=True
    )
    assert code == 129, log
    assert "SIGHUP: saved a resumable checkpoint" in log or "SIGHUP: stopping after epoch" in log, log


@pytest.mark.cpu_only(
    reason="drawing and the run's last lines are host-side; device training: tests/scripts/test_train.py"
)
def test_without_matplotlib_the_last_line_lists_only_what_the_run_wrote(fashion4: Path, tmp_path: Path) -> None:
    """No matplotlib: the run says it cannot draw curves.png, and its last line and its ledger do not name
    one; resumed so, a curves.png drawn before the resume (now out of date) goes, said in the same line."""
    shadow = tmp_path / "shadow" / "matplotlib"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('No module named matplotlib')\n")
    hidden = {"PYTHONPATH": f"{tmp_path / 'shadow'}{os.pathsep}{REPO}"}
    run = tmp_path / "run"

    def last_line(proc: subprocess.CompletedProcess) -> str:
        """The line that lists what the run wrote (a data-wait reminder may follow it)."""
        assert proc.returncode == 0, proc.stderr
        return next(line for line in proc.stdout.splitlines() if line.startswith("finished in"))

    line = last_line(run_script(_one_epoch(fashion4, tmp_path, "run", "--device", "cpu"), env=hidden))
    assert "summary.csv" in line and "curves.png" not in line, line
    assert not (run / "curves.png").exists() and "curves.png" not in (run / ".vtools-run.lock").read_text()

    drawn = last_line(run_script([*_one_epoch(fashion4, tmp_path, "run", "--device", "cpu"), "--resume", "auto"]))
    assert "curves.png" in drawn and (run / "curves.png").is_file()
    resumed = run_script(
        [*_one_epoch(fashion4, tmp_path, "run", "--device", "cpu"), "--resume", "auto", "--epochs", "2"], env=hidden
    )
    assert "no curves.png (the one drawn before the resume is removed): drawing curves.png needs" in resumed.stdout
    assert "curves.png" not in last_line(resumed) and not (run / "curves.png").exists()


@pytest.mark.slow
@pytest.mark.cpu_only(reason="the order of an epoch's files is the host's; the device runs are the other tests'")
def test_an_epoch_whose_row_cannot_be_written_is_not_committed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """summary.csv fails at epoch 1 (a full disk, a file made read-only): the run stops and its checkpoint
    still records epoch 1 as to do, so a resume trains it again and no row is lost."""
    import errno

    import vtools
    from vtools.errors import RunFailed
    from vtools.train import run as training_run

    written = training_run.write_summary
    calls = []

    def full_at_epoch_1(claim: object, rows: list) -> object:
        calls.append(len(rows))
        if len(rows) == 2:
            raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "run" / "summary.csv"))
        return written(claim, rows)

    data = fashion_subset(tmp_path / "data", 8, 2)
    options = {"device": "cpu", "data_dir": data, "model": "test_resnet", "epochs": 2, "output": tmp_path}
    options |= {"experiment": "run", "workers": 1, "batch_size": 16}
    monkeypatch.setattr(training_run, "write_summary", full_at_epoch_1)
    with pytest.raises((RunFailed, OSError)):
        vtools.fit(REPO / "configs" / "fashion_mnist_cpu.yaml", **options)
    assert calls == [1, 2]
    last = torch.load(tmp_path / "run" / "last.pth.tar", map_location="cpu", weights_only=True)
    assert last["epoch"] == 1  # epoch 0 done, epoch 1 to do: the failed epoch is not committed
    monkeypatch.setattr(training_run, "write_summary", written)
    outcome = vtools.fit(REPO / "configs" / "fashion_mnist_cpu.yaml", **options, resume="auto")
    assert outcome.code == 0 and [int(row["epoch"]) for row in outcome.summary] == [0, 1]
