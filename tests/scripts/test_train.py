"""train.py end to end on the shipped Fashion-MNIST subset: learning, exact resume, torchrun, errors."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import (
    CLASSES,
    DEVICE_TYPES,
    ONE_THREAD,
    REPO,
    SECOND_DEVICES,
    assert_one_line_error,
    assert_same_weights,
    assert_usage_error,
    autoload_env,
    children,
    device_flags,
    free_port,
    rank_of,
    run_script,
    start_script,
    summary,
    torchrun,
    train_args,
    weights,
)
from vtools.cli.runner import command_main

PRECISIONS = [(d, None) for d in DEVICE_TYPES + SECOND_DEVICES] + [
    (d, dt) for d in DEVICE_TYPES if d != "cpu" for dt in ("bfloat16", "float16")
]


@pytest.mark.parametrize("device_type, amp_dtype", PRECISIONS)
def test_short_run_learns(device_type: str, amp_dtype: str | None, fashion4: Path, tmp_path: Path) -> None:
    amp = ["--amp", "--amp-dtype", amp_dtype] if amp_dtype else []
    proc = run_script(train_args(fashion4, tmp_path, "run", *device_flags(device_type), *amp))
    assert proc.returncode == 0, proc.stderr
    rows = summary(tmp_path / "run")
    assert [int(r["epoch"]) for r in rows] == [0, 1, 2]
    assert float(rows[-1]["train_loss"]) < float(rows[0]["train_loss"])
    assert float(rows[-1]["eval_top1"]) > 50.0  # chance is 25 %
    assert all(int(r["eval_samples"]) == 60 for r in rows)
    assert all(0.0 <= float(r["data_wait"]) < 1.0 for r in rows)
    assert ("GradScaler" in proc.stdout) == (amp_dtype == "float16")
    assert f"training test_resnet on {device_type}" in proc.stdout  # npu:1 really trains on device 1
    assert (tmp_path / "run" / "model" / "model.safetensors").is_file()


@pytest.mark.cpu_only(reason="export and config round trip are host-side; npu training: test_short_run_learns")
def test_exported_folder_validates_and_config_reruns(fashion4: Path, tmp_path: Path) -> None:
    proc = run_script(train_args(fashion4, tmp_path, "first", "--epochs", "2", "--device", "cpu"))
    assert proc.returncode == 0, proc.stderr
    first = tmp_path / "first"
    best = max(summary(first), key=lambda r: float(r["eval_top1"]))
    results = tmp_path / "val.json"
    proc = run_script(
        [
            "validate.py",
            str(fashion4 / "val"),
            "--model",
            str(first / "model"),
            "--device",
            "cpu",
            "--results-file",
            str(results),
            "--results-format",
            "json",
        ]
    )
    assert proc.returncode == 0, proc.stderr
    row = json.loads(results.read_text())[0]
    assert row["top1"] == pytest.approx(float(best["eval_top1"]), abs=1e-3)
    assert row["samples"] == 60
    # the written config repeats the run exactly
    proc = run_script(["train.py", "-c", str(first / "config.yaml"), "--experiment", "again"])
    assert proc.returncode == 0, proc.stderr
    assert_same_weights(weights(first / "last.pth.tar"), weights(tmp_path / "again" / "last.pth.tar"))


RECIPE = [
    "--epochs",
    "3",
    "--checkpoint-hist",
    "3",
    "--workers",
    "2",
    "--mixup",
    "0.2",
    "--cutmix",
    "0.5",
    "--reprob",
    "0.25",
    "--aa",
    "rand-m5-mstd0.5",
    "--model-ema",
    "--model-ema-decay",
    "0.9",
    "--grad-accum-steps",
    "2",
    "--clip-grad",
    "1.0",
    "--drop-path",
    "0.05",
    "--channels-last",
    "--sched-on-updates",
    "--log-interval",
    "3",
]


RESUME_CASES = [(d, None) for d in DEVICE_TYPES] + [(d, "float16") for d in DEVICE_TYPES if d != "cpu"]


@pytest.mark.parametrize("device_type, amp_dtype", RESUME_CASES)
def test_resume_after_epoch_matches_uninterrupted(
    device_type: str, amp_dtype: str | None, fashion4: Path, tmp_path: Path
) -> None:
    """Stop after epoch 0, resume: the weights (and EMA) end identical, with the device's own random
    streams (drop-path and erasing draw on the device) and, in float16, the GradScaler's state restored.
    Three epochs, so that an epoch follows the resumed run's first validation (whose loader must not
    draw from the global RNG)."""
    recipe = [*RECIPE, *device_flags(device_type)] + (["--amp", "--amp-dtype", amp_dtype] if amp_dtype else [])
    proc = run_script(train_args(fashion4, tmp_path, "full", *recipe))
    assert proc.returncode == 0, proc.stderr
    full = tmp_path / "full"
    proc = run_script(
        train_args(fashion4, tmp_path, "resumed", *recipe, "--resume", str(full / "checkpoint-0.pth.tar"))
    )
    assert proc.returncode == 0, proc.stderr
    assert "resumed from" in proc.stdout
    resumed = tmp_path / "resumed"
    assert_same_weights(weights(full / "last.pth.tar"), weights(resumed / "last.pth.tar"))
    assert_same_weights(
        weights(full / "last.pth.tar", "state_dict_ema"), weights(resumed / "last.pth.tar", "state_dict_ema")
    )


@pytest.mark.cpu_only(
    reason="signal and --resume auto bookkeeping are host-side; exact npu resume: "
    "test_resume_after_epoch_matches_uninterrupted"
)
def test_sigterm_then_resume_auto_continues_the_same_run(fashion4: Path, tmp_path: Path) -> None:
    """SIGTERM to the process group mid-epoch (loader workers leave it to the main process) writes a
    checkpoint; re-running the same command (no --experiment: the folder is timestamped) with --resume
    auto finds that run, ends with the uninterrupted weights, and the
    interrupted epoch's train_loss covers the whole epoch."""
    common = ["--device", "cpu", "--epochs", "6", "--log-interval", "1", "--resume", "auto"]
    args = train_args(fashion4, tmp_path / "out", None, *common)
    proc = start_script(args)
    for line in proc.stdout:  # signal during epoch 1
        if line.startswith("epoch 0:"):
            break
    os.killpg(proc.pid, signal.SIGTERM)  # the whole process group, loader workers too, as a scheduler does
    stdout, stderr = proc.communicate(timeout=300)
    assert "killed by signal" not in stderr
    assert proc.returncode == 143, stderr
    # mid-epoch as a rule; right at the epoch's end when the signal lands before the loop's next check
    assert "SIGTERM: saved a resumable checkpoint" in stdout or "SIGTERM: stopping after epoch 0" in stdout, stdout
    [run] = list((tmp_path / "out").iterdir())
    assert run.name.startswith("test_resnet-")
    state = torch.load(run / "last.pth.tar", map_location="cpu", weights_only=True)
    assert 1 <= state["epoch"] < 6
    interrupted_epoch = state["epoch"]
    done = run_script(args)
    assert done.returncode == 0, done.stderr
    assert f"--resume auto: continuing {run}" in done.stdout
    assert list((tmp_path / "out").iterdir()) == [run]
    reference = run_script(train_args(fashion4, tmp_path, "reference", *common))
    assert reference.returncode == 0, reference.stderr
    assert_same_weights(weights(tmp_path / "reference" / "last.pth.tar"), weights(run / "last.pth.tar"))
    resumed_rows, reference_rows = summary(run), summary(tmp_path / "reference")
    assert [int(r["epoch"]) for r in resumed_rows] == list(range(6))
    for ours, theirs in zip(resumed_rows, reference_rows):
        assert float(ours["train_loss"]) == pytest.approx(float(theirs["train_loss"]), rel=1e-6), ours["epoch"]
        assert ours["lr"] == theirs["lr"]
    assert int(resumed_rows[interrupted_epoch]["epoch"]) == interrupted_epoch
    # the interrupted epoch's speed is the resumed process's own: the images it trained over its time
    row, trained_here = resumed_rows[interrupted_epoch], (7 - state["step_in_epoch"]) * 32
    if trained_here:
        assert float(row["img_per_sec"]) == pytest.approx(trained_here / float(row["epoch_seconds"]), rel=0.05), row
    else:  # stopped after the epoch's last step: the resumed process trained none of it
        assert row["img_per_sec"] == row["epoch_seconds"] == row["data_wait"] == "", row


@pytest.mark.parametrize("device_type", DEVICE_TYPES)
def test_dead_loader_worker_is_a_runtime_failure(device_type: str, fashion4: Path, tmp_path: Path) -> None:
    """A loader worker killed mid-epoch (as the OOM killer does) ends the run with exit 3 and one line
    naming the cause, not a traceback; the previous epoch's checkpoint stays intact."""
    args = train_args(
        fashion4,
        tmp_path,
        "crashed",
        *device_flags(device_type),
        "--epochs",
        "8",
        "--workers",
        "2",
        "--log-interval",
        "1",
    )
    proc = start_script(args)
    try:
        for line in proc.stdout:
            if line.startswith("epoch 0:"):
                break
        workers = children(proc.pid)
        assert workers, "no loader worker to kill"
        os.kill(workers[0], signal.SIGKILL)
        proc.stdout.read()
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    completed = subprocess.CompletedProcess(args, proc.returncode, "", proc.stderr.read())
    assert_one_line_error(completed, 3, "a data-loader worker died", "DataLoader worker (pid", "--workers")
    state = torch.load(tmp_path / "crashed" / "last.pth.tar", map_location="cpu", weights_only=True)
    assert state["epoch"] >= 1


# The multi-NPU line as a user types it on an Ascend host (torch_npu autoloaded by ``import torch``: no
# --device-modules); on the emulated npu, "hccl" is tests/emulated_npu/process_group.py.
TORCHRUN_LINE = "torchrun --nproc-per-node 2 train.py --device npu"


def two_devices(device_type: str) -> None:
    """Skip a 2-rank run on a device type with fewer than two devices here (cuda on a 1-GPU host)."""
    if device_type == "cuda" and torch.cuda.device_count() < 2:
        pytest.skip("needs two cuda devices")


def run_torchrun_line(device_type: str, *train_flags: str) -> subprocess.CompletedProcess:
    """``TORCHRUN_LINE`` on ``device_type``, then ``train_flags``, as a shell would split it, with the
    emulator autoloaded in every rank as torch_npu is; ``torchrun`` is this interpreter's
    (``python -m torch.distributed.run``), its rendezvous on a free local port (torchrun's PET_* env)."""
    argv = shlex.split(TORCHRUN_LINE.replace("--device npu", f"--device {device_type}"))
    assert argv[0] == "torchrun"
    env = {
        **autoload_env(),
        "PET_MASTER_ADDR": "127.0.0.1",
        "PET_MASTER_PORT": str(free_port()),
        "OMP_NUM_THREADS": "1",
    }
    return run_script(["-m", "torch.distributed.run", *argv[1:], *train_flags], env=env, timeout=300)


@pytest.mark.parametrize("device_type", DEVICE_TYPES)
def test_torchrun_two_processes_counts_each_sample_once(device_type: str, fashion4: Path, tmp_path: Path) -> None:
    """Two ranks (gloo on cpu, hccl on npu): DDP trains, and validation shards count each image once."""
    two_devices(device_type)
    val = fashion4 / "val"
    odd = tmp_path / "odd"  # 59 validation images: shards of 30 and 29, no padded duplicates, uneven batches
    shutil.copytree(fashion4, odd)
    next((odd / "val" / "bag").iterdir()).unlink()
    flags = train_args(odd, tmp_path, "ddp", "--epochs", "1", "--validation-batch-size", "29")[1:]  # 2 and 1 batches
    proc = run_torchrun_line(device_type, *flags)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"on {device_type}" in proc.stdout and "2 process(es)" in proc.stdout
    rows = summary(tmp_path / "ddp")
    assert int(rows[0]["eval_samples"]) == 59
    assert proc.stdout.count("training test_resnet") == 1  # only rank 0 reports
    assert len(list(val.rglob("*.png"))) == 60
    # the class report both ranks gathered equals one process's on the same weights and images
    solo = run_script(
        ["validate.py", str(odd / "val"), "--model", str(tmp_path / "ddp" / "model"), "--report", str(tmp_path / "one")]
        + ["--batch-size", "29", *device_flags(device_type)]
    )
    assert solo.returncode == 0, solo.stderr[-3000:]
    assert_same_class_report(tmp_path / "ddp" / "eval", tmp_path / "one")


def assert_same_class_report(gathered: Path, single: Path) -> None:
    """Per-class counts, the confusion matrix and the mistakes (by image) equal; probabilities within float
    noise (batches were cut differently)."""
    import pandas as pd

    counts = ["class", "support", "correct", "predicted", "top1", "top5", "precision", "recall", "f1"]
    a, b = pd.read_csv(gathered / "per_class.csv"), pd.read_csv(single / "per_class.csv")
    pd.testing.assert_frame_equal(a[counts], b[counts])
    assert a["support"].sum() == 59
    pd.testing.assert_frame_equal(
        pd.read_csv(gathered / "confusion.csv", index_col=0), pd.read_csv(single / "confusion.csv", index_col=0)
    )
    a, b = (pd.read_csv(folder / "misclassified.csv").set_index("sample").sort_index() for folder in (gathered, single))
    assert list(a.index) == list(b.index) and a.index.is_unique
    assert (a[["label", "predicted"]] == b[["label", "predicted"]]).all().all()
    assert (a["confidence"] - b["confidence"]).abs().max() < 1e-3


@pytest.mark.parametrize("device_type", DEVICE_TYPES)
def test_torchrun_stop_agreed_across_ranks_and_resumed_exactly(
    device_type: str, fashion4: Path, tmp_path: Path
) -> None:
    """SIGTERM reaches rank 1, and rank 0 only later: both stop after the same update, one checkpoint
    holds each rank's own RNG state, and the resumed 2-process run ends with the weights of an
    uninterrupted one. Dropout and mixup draw from each rank's own generators, so a rank that
    restored another rank's state would train differently. On npu every collective (the stop
    agreement, DDP's gradient buckets, the checkpoint's gathered RNG states) goes through hccl."""
    two_devices(device_type)
    common = [
        *device_flags(device_type),
        "--epochs",
        "4",
        "--batch-size",
        "8",
        "--log-interval",
        "1",
        "--drop",
        "0.3",
        "--mixup",
        "0.3",
        "--resume",
        "auto",
    ]
    launcher = start_script(torchrun(train_args(fashion4, tmp_path, "stopped", *common)), env=ONE_THREAD)
    try:
        for line in launcher.stdout:
            if line.startswith("epoch 0:"):
                break
        ranks = {rank_of(pid): pid for pid in children(launcher.pid)}
        assert set(ranks) >= {0, 1}, ranks
        os.kill(ranks[1], signal.SIGTERM)
        time.sleep(0.5)
        try:
            os.kill(ranks[0], signal.SIGTERM)
        except ProcessLookupError:
            pass  # rank 0 had already stopped on rank 1's signal
        stdout, stderr = launcher.communicate(timeout=180)  # ranks that disagree hang in mismatched collectives
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
    assert launcher.returncode != 0, "the run finished before the signals arrived"
    assert "SIGTERM: saved a resumable checkpoint" in stdout, stderr[-3000:]
    state = torch.load(tmp_path / "stopped" / "last.pth.tar", map_location="cpu", weights_only=True)
    assert len(state["rank_states"]) == 2
    assert not torch.equal(state["rank_states"][0]["rng"]["torch"], state["rank_states"][1]["rng"]["torch"])
    resumed = run_script(
        torchrun(train_args(fashion4, tmp_path, "stopped", *common)), env={"OMP_NUM_THREADS": "1"}, timeout=300
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stdout
    reference = run_script(
        torchrun(train_args(fashion4, tmp_path, "reference", *common)), env={"OMP_NUM_THREADS": "1"}, timeout=300
    )
    assert reference.returncode == 0, reference.stderr[-3000:]
    assert_same_weights(
        weights(tmp_path / "reference" / "last.pth.tar"), weights(tmp_path / "stopped" / "last.pth.tar")
    )


# ---------------------------------------------------------------- more of the recipe
# (bad input and a diverged run, one line each: tests/scripts/test_one_line_errors.py)


@pytest.mark.parametrize("device_type", DEVICE_TYPES)
def test_torchcompile_and_ema_export(device_type: str, fashion4: Path, tmp_path: Path) -> None:
    """--torchcompile (eager backend: dynamo without code generation) trains; the EMA weights are exported."""
    proc = run_script(
        train_args(
            fashion4,
            tmp_path,
            "compiled",
            *device_flags(device_type),
            "--epochs",
            "1",
            "--torchcompile",
            "eager",
            "--model-ema",
            "--model-ema-decay",
            "0.5",
        )
    )
    assert proc.returncode == 0, proc.stderr
    run = tmp_path / "compiled"
    state = torch.load(run / "last.pth.tar", map_location="cpu", weights_only=True)
    assert not any(key.startswith("_orig_mod") for key in state["state_dict"])
    from safetensors.torch import load_file

    exported = load_file(str(run / "model" / "model.safetensors"))
    assert_same_weights(exported, state["state_dict_ema"])
    assert json.loads((run / "model" / "config.json").read_text())["label_names"] == CLASSES


@pytest.mark.cpu_only(
    reason="flag plumbing into timm's factories is host-side; the npu loop runs the recipe in "
    "test_resume_after_epoch_matches_uninterrupted"
)
def test_more_recipe_flags(fashion4: Path, tmp_path: Path) -> None:
    """BCE loss, step schedule, lr scaled from --lr-base, loss as the metric, mixup switched off, layer
    decay, a starting checkpoint, one kept checkpoint: a run that uses them all trains and obeys them."""
    start = tmp_path / "start.safetensors"
    import timm
    from safetensors.torch import save_file

    save_file(timm.create_model("test_resnet", num_classes=4).state_dict(), str(start))
    config = tmp_path / "run.yaml"
    config.write_text(
        f"data-dir: {fashion4}\nmodel: test_resnet\nimg-size: 32\nbatch-size: 16\nepochs: 3\n"
        "lr-base: 0.05\nlr-base-size: 64\nsched: step\ndecay-epochs: 1\ndecay-rate: 0.5\n"
        "warmup-epochs: 0\nbce-loss: true\nmixup: 0.2\nmixup-off-epoch: 1\nlayer-decay: 0.9\n"
        "eval-metric: loss\ncheckpoint-hist: 1\nvalidation-batch-size: 7\nno-aug: true\n"
        "momentum: 0.8\nworkers: 0\n"
    )
    proc = run_script(
        [
            "train.py",
            "-c",
            str(config),
            "--output",
            str(tmp_path),
            "--experiment",
            "more",
            "--device",
            "cpu",
            "--initial-checkpoint",
            str(start),
            "--dist-backend",
            "gloo",
        ]
    )
    assert proc.returncode == 0, proc.stderr
    assert "(0.0125 at its peak)" in proc.stdout  # 0.05 * 16 / 64, reached after the warm-up
    run = tmp_path / "more"
    rows = summary(run)
    lrs = [float(r["lr"]) for r in rows]
    assert lrs[0] > lrs[1] > lrs[2]  # step decay every epoch
    assert sorted(p.name for p in run.glob("checkpoint-*.pth.tar")) == ["checkpoint-2.pth.tar"]
    best = torch.load(run / "model_best.pth.tar", map_location="cpu", weights_only=True)
    losses = [float(r["eval_loss"]) for r in rows]
    assert best["best_epoch"] == losses.index(min(losses))


@pytest.mark.cpu_only(reason="run-folder bookkeeping is host-side")
def test_resume_auto_without_checkpoint_starts_fresh(fashion4: Path, tmp_path: Path) -> None:
    proc = run_script(train_args(fashion4, tmp_path, "fresh", "--device", "cpu", "--epochs", "1", "--resume", "auto"))
    assert proc.returncode == 0, proc.stderr
    assert "no checkpoint" in proc.stdout and len(summary(tmp_path / "fresh")) == 1


# ---------------------------------------------------------------- unreadable training images


@pytest.fixture(scope="session")
def mostly_bad(tmp_path_factory: pytest.TempPathFactory, fashion4: Path) -> Path:
    """4 readable images per class and 60 zero-byte PNGs among them (the issue's case), readable val."""
    root = tmp_path_factory.mktemp("mostly_bad")
    shutil.copytree(fashion4 / "val", root / "val")
    for name in CLASSES:
        (root / "train" / name).mkdir(parents=True)
        for file in sorted((fashion4 / "train" / name).glob("*.png"))[:4]:
            shutil.copy(file, root / "train" / name / file.name)
        for i in range(15):
            (root / "train" / name / f"empty_{i:02d}.png").write_bytes(b"")
    return root


def _has_all_bad_batch(root: Path, batch_size: int, seed: int = 42) -> bool:
    """Whether epoch 0's order holds a batch of only unreadable files (the premise of the test)."""
    from vtools.data.readers.folder import labelled_images
    from vtools.data.sampling import EpochSampler

    paths = [Path(path) for path in labelled_images(root / "train").entries.paths]
    sampler = EpochSampler(len(paths), seed)
    sampler.set_epoch(0)
    order = [paths[index] for _, index in sampler]
    return any(
        all(p.stat().st_size == 0 for p in order[i : i + batch_size])
        for i in range(0, len(order) - batch_size + 1, batch_size)
    )


@pytest.mark.parametrize("device_type", DEVICE_TYPES)
@pytest.mark.parametrize("mixup", [False, True])
def test_bad_training_images_are_replaced_and_batches_stay_full(
    device_type: str, mixup: bool, mostly_bad: Path, tmp_path: Path
) -> None:
    assert _has_all_bad_batch(mostly_bad, 2)
    extra = ["--mixup", "0.4"] if mixup else []
    proc = run_script(
        train_args(
            mostly_bad,
            tmp_path,
            "bad",
            *device_flags(device_type),
            "--epochs",
            "1",
            "--batch-size",
            "2",
            "--on-bad-image",
            "skip",
            *extra,
        )
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("warning: skipped unreadable")]
    assert len(warnings) == 60  # each bad file named once
    assert all("another image in its place" in line for line in warnings)
    rows = summary(tmp_path / "bad")
    assert len(rows) == 1 and float(rows[0]["train_loss"]) > 0


# ---------------------------------------------------------------- a run owns its folder


@pytest.mark.cpu_only(reason="folder ownership is host-side")
def test_a_second_run_into_a_live_run_folder_is_refused(fashion4: Path, tmp_path: Path) -> None:
    args = train_args(fashion4, tmp_path, "shared", "--device", "cpu", "--epochs", "2")
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    first = subprocess.Popen(
        [sys.executable, *args], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    for line in first.stdout:
        if line.startswith("training test_resnet"):
            break
    first.send_signal(signal.SIGSTOP)  # hold it mid-run, whatever the machine's speed
    try:
        second = run_script([*args, "--lr", "0.5"])
    finally:
        first.send_signal(signal.SIGCONT)
    stdout, stderr = first.communicate(timeout=300)
    assert_usage_error(second, "belongs to a training run that is still going", f"pid {first.pid}")
    assert first.returncode == 0, stderr
    run = tmp_path / "shared"
    assert [int(r["epoch"]) for r in summary(run)] == [0, 1]
    assert "lr: 0.005" in (run / "config.yaml").read_text()  # the first run's config, not the second's


@pytest.mark.cpu_only(reason="folder ownership is host-side")
def test_rerunning_a_named_run_leaves_the_ended_one_alone(fashion4: Path, tmp_path: Path) -> None:
    """The quick start names its folder in YAML: running it twice must not overwrite the first run.
    The second run writes to <name>-2 and says so; --resume auto still continues the named one."""
    args = train_args(fashion4, tmp_path, "named", "--device", "cpu", "--epochs", "1")
    first = run_script(args)
    assert first.returncode == 0, first.stderr
    run = tmp_path / "named"
    before = {path.name: path.read_bytes() for path in run.iterdir() if path.is_file()}

    second = run_script([*args, "--lr", "0.01"])

    assert second.returncode == 0, second.stderr
    assert f"{run} holds an earlier run, left as it is: this run writes to {tmp_path / 'named-2'}" in second.stdout
    assert {path.name: path.read_bytes() for path in run.iterdir() if path.is_file()} == before
    assert "lr: 0.01" in (tmp_path / "named-2" / "config.yaml").read_text()
    assert [int(r["epoch"]) for r in summary(tmp_path / "named-2")] == [0]
    resumed = run_script([*args, "--epochs", "2", "--resume", "auto"])
    assert resumed.returncode == 0, resumed.stderr
    assert [int(r["epoch"]) for r in summary(run)] == [0, 1]


@pytest.mark.cpu_only(reason="folder naming is host-side")
def test_runs_started_in_the_same_second_get_their_own_folders(tmp_path: Path) -> None:
    from vtools.train.run_lock import reserve_new_folder

    first = reserve_new_folder(tmp_path, "test_resnet-20261130-120000")
    second = reserve_new_folder(tmp_path, "test_resnet-20261130-120000")
    assert first != second and first.is_dir() and second.is_dir()
    assert second.name == "test_resnet-20261130-120000-2"


# ---------------------------------------------------------------- signals during validation, and twice


def _train_in_process(data: Path, out: Path, name: str, *extra: str) -> int:

    return command_main("train")(
        train_args(data, out, name, "--device", "cpu", "--epochs", "2", "--workers", "0", *extra)[1:]
    )


def _signal_at_validation(monkeypatch: pytest.MonkeyPatch, epoch: int, times: int) -> None:
    """Deliver SIGTERM ``times`` times to this process when validation of ``epoch`` starts."""
    from vtools.train import run

    real = run.evaluate

    def evaluate(*args, **kwargs):
        if kwargs.get("desc") == f"validate {epoch}":
            for _ in range(times):
                os.kill(os.getpid(), signal.SIGTERM)
        return real(*args, **kwargs)

    monkeypatch.setattr(run, "evaluate", evaluate)


@pytest.mark.cpu_only(reason="signal handling is host-side; npu resume: test_resume_after_epoch_matches_uninterrupted")
def test_sigterm_during_the_last_validation_saves_and_resumes(
    fashion4: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _train_in_process(fashion4, tmp_path, "reference") == 0
    with monkeypatch.context() as patch:
        _signal_at_validation(patch, epoch=1, times=1)
        assert _train_in_process(fashion4, tmp_path, "stopped") == 143
    state = torch.load(tmp_path / "stopped" / "last.pth.tar", map_location="cpu", weights_only=True)
    assert (state["epoch"], state["step_in_epoch"]) == (1, 7)  # all 7 steps trained, validation not done
    assert [int(r["epoch"]) for r in summary(tmp_path / "stopped")] == [0]
    assert _train_in_process(fashion4, tmp_path, "stopped", "--resume", "auto") == 0
    assert_same_weights(
        weights(tmp_path / "reference" / "last.pth.tar"), weights(tmp_path / "stopped" / "last.pth.tar")
    )
    ours, theirs = summary(tmp_path / "stopped"), summary(tmp_path / "reference")
    assert [r["eval_top1"] for r in ours] == [r["eval_top1"] for r in theirs]
    assert float(ours[1]["train_loss"]) == pytest.approx(float(theirs[1]["train_loss"]), rel=1e-6)
    # epoch 1's steps were all trained before the stop: no speed measured after the resume, and no 0.0
    assert ours[1]["img_per_sec"] == ours[1]["epoch_seconds"] == ours[1]["data_wait"] == "", ours[1]
    assert float(ours[0]["img_per_sec"]) > 0


@pytest.mark.cpu_only(reason="signal handling is host-side")
def test_a_second_sigterm_stops_at_once_with_the_same_code(
    fashion4: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _signal_at_validation(monkeypatch, epoch=1, times=2)
    with pytest.raises(SystemExit) as stopped:
        _train_in_process(fashion4, tmp_path, "twice")
    assert stopped.value.code == 143
    state = torch.load(tmp_path / "twice" / "last.pth.tar", map_location="cpu", weights_only=True)
    assert state["epoch"] == 1  # epoch 0's checkpoint is intact


@pytest.mark.cpu_only(reason="checkpoint choice is host-side")
def test_resume_auto_falls_back_to_the_newest_intact_checkpoint(
    fashion4: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    assert _train_in_process(fashion4, tmp_path, "run") == 0
    last = tmp_path / "run" / "last.pth.tar"
    last.write_bytes(last.read_bytes()[:1000])  # truncated, e.g. by a copy that died
    assert _train_in_process(fashion4, tmp_path, "run", "--epochs", "3", "--resume", "auto") == 0
    out = capsys.readouterr().out
    assert "is damaged; continuing from checkpoint-1.pth.tar" in out
    assert "resumed from" in out and "at epoch 2, step 0" in out
    assert [int(r["epoch"]) for r in summary(tmp_path / "run")] == [0, 1, 2]


@pytest.mark.cpu_only(reason="which weights are loaded is host-side; the folder loads onto npu in test_validate")
def test_fine_tuning_from_a_model_folder_starts_from_its_weights(fashion4: Path, tmp_path: Path) -> None:
    """A model folder is its weights (as --help says); a new class count re-heads it, and the run says so."""
    from safetensors.torch import load_file

    from tests.conftest import write_model_folder

    folder = write_model_folder(tmp_path / "pretrained", 10)
    proc = run_script(
        train_args(
            fashion4,
            tmp_path,
            "tuned",
            "--device",
            "cpu",
            "--model",
            str(folder),
            "--epochs",
            "1",
            "--lr",
            "0",
            "--warmup-epochs",
            "0",
            "--min-lr",
            "0",
            "--weight-decay",
            "0",
        )
    )
    assert proc.returncode == 0, proc.stderr
    assert f"weights from {folder}, classifier re-initialised (10 -> 4 classes)" in proc.stdout
    start = load_file(str(folder / "model.safetensors"))
    trained = weights(tmp_path / "tuned" / "last.pth.tar")
    assert torch.equal(trained["conv1.0.weight"], start["conv1.0.weight"])  # lr 0: still the folder's
    assert trained["fc.weight"].shape[0] == 4


@pytest.mark.cpu_only(reason="preprocessing bookkeeping is host-side; npu validation: tests/scripts/test_validate.py")
def test_a_run_checkpoint_validates_with_the_runs_preprocessing(fashion4: Path, tmp_path: Path) -> None:
    """validate.py --checkpoint on a run's checkpoint uses the run's data config (size, interpolation,
    crop), not the architecture's defaults, so it reproduces the run's own numbers; flags still win."""
    proc = run_script(
        train_args(
            fashion4,
            tmp_path,
            "run",
            "--device",
            "cpu",
            "--epochs",
            "1",
            "--img-size",
            "40",
            "--interpolation",
            "nearest",
            "--crop-pct",
            "0.9",
        )
    )
    assert proc.returncode == 0, proc.stderr
    row = summary(tmp_path / "run")[0]
    results = tmp_path / "v.json"
    common = [
        "validate.py",
        str(fashion4 / "val"),
        "--model",
        "test_resnet",
        "--num-classes",
        "4",
        "--device",
        "cpu",
        "--checkpoint",
        str(tmp_path / "run" / "last.pth.tar"),
        "--results-file",
        str(results),
        "--results-format",
        "json",
    ]
    assert run_script(common).returncode == 0
    validated = json.loads(results.read_text())[0]
    assert (validated["img_size"], validated["interpolation"], validated["crop_pct"]) == (40, "nearest", 0.9)
    assert validated["top1"] == pytest.approx(float(row["eval_top1"]), abs=1e-3)
    assert validated["loss"] == pytest.approx(float(row["eval_loss"]), rel=1e-4)
    assert run_script([*common, "--img-size", "48"]).returncode == 0
    assert json.loads(results.read_text())[0]["img_size"] == 48


@pytest.mark.cpu_only(reason="the seam's result is host-side; the runs it wraps are tested on every device above")
def test_train_run_says_how_the_run_ended(fashion4: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """train_run (the seam the Python API calls) trains as train.py does and returns the run's folder, its
    model folder and the summary.csv rows it wrote. The learning rate walks from its flag through the job
    alone: to the optimizer, config.yaml, the trackers' parameters, the checkpoint and the resume check."""
    from vtools.cli.config import read_yaml
    from vtools.cli.train_flags import parse, typed
    from vtools.commands import train
    from vtools.train.resume import SavedOptions, experiment_changes

    told: list[dict] = []
    watch_run = train.watch_run
    monkeypatch.setattr(train, "watch_run", lambda *a: told.append(a[-1]) or watch_run(*a))  # the trackers' params
    argv = train_args(fashion4, tmp_path, "outcome", "--device", "cpu", "--epochs", "1", "--workers", "0")
    job = typed(parse([*argv[1:], "--lr", "0.0123", "--warmup-epochs", "0", "--sched", "step"]))
    outcome = train.train_run(job)
    assert float(outcome.summary[0]["lr"]) == pytest.approx(0.0123)  # what the optimizer stepped with
    assert read_yaml(outcome.folder / "config.yaml")["lr"] == 0.0123
    assert told[0]["lr"] == 0.0123 and told[0] == {**job.values(), "batch_size": told[0]["batch_size"]}
    state = torch.load(outcome.folder / "last.pth.tar", map_location="cpu", weights_only=True)
    assert state["args"]["lr"] == 0.0123
    other = typed(parse([*argv[1:], "--lr", "0.5", "--warmup-epochs", "0", "--sched", "step"]))
    same = experiment_changes(state, SavedOptions.of(job), [], 0, 1)  # (no classes given: those differ)
    changed = experiment_changes(state, SavedOptions.of(other), [], 0, 1)
    assert [change for change in changed if change not in same] == ["--lr 0.0123 -> 0.5"]
    assert (outcome.code, outcome.folder, outcome.model_dir) == (
        0,
        tmp_path / "outcome",
        tmp_path / "outcome" / "model",
    )
    assert (outcome.model_dir / "config.json").is_file()
    assert outcome.summary == summary(outcome.folder) and [row["epoch"] for row in outcome.summary] == ["0"]
