"""``vtools avg-checkpoints`` and ``vtools clean-checkpoint`` on a real run's checkpoints, trained on cpu and on
the emulated npu: each epoch's checkpoint records its metric as timm's saver does (the summary row's), the best
-n are chosen by it, only the files the run's ledger lists count, the averaged model folder validates, and a
cleaned checkpoint holds exactly the run's weights under a name carrying its file's hash. Then what the
committed case table (probe_cases/checkpoint_tools.yaml) cannot hold: validate.py reading averaged weights on
each device, a full disk (a tmpfs mounted for the test), two cleans of one name at once, and .gitignore."""

from __future__ import annotations

import csv
import functools
import hashlib
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import DEVICE_TYPES, REPO, assert_one_line_error, device_flags, run_script, train_args
from tests.scripts.probe_cases import checkpoint_tools as make
from vtools.cli.runner import command_main

EPOCHS = 4


@pytest.fixture(scope="module")
def runs(fashion4: Path, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """A 4-epoch run with EMA weights, every numbered checkpoint kept, per device type (trained once each)."""

    @functools.cache
    def run(device_type: str) -> Path:
        out = tmp_path_factory.mktemp(f"run-{device_type}")
        flags = ["--epochs", str(EPOCHS), "--checkpoint-hist", str(EPOCHS), "--model-ema"]
        flags += ["--model-ema-decay", "0.5"]  # EMA weights well apart from the plain ones after 4 epochs
        proc = run_script([*train_args(fashion4, out, "r", *flags), *device_flags(device_type)])
        assert proc.returncode == 0, proc.stderr
        return out / "r"

    return run


def _metric(path: Path) -> float:
    return torch.load(path, weights_only=True)["metric"]


@pytest.mark.parametrize("device_type", DEVICE_TYPES)
def test_each_epoch_checkpoint_records_its_summary_rows_metric(device_type: str, runs: Callable[[str], Path]) -> None:
    run = runs(device_type)
    with (run / "summary.csv").open(newline="") as handle:
        rows = {int(row["epoch"]): float(row["eval_top1"]) for row in csv.DictReader(handle)}
    for epoch, top1 in rows.items():
        assert _metric(run / f"checkpoint-{epoch}.pth.tar") == pytest.approx(top1, abs=1e-4)


@pytest.mark.parametrize("device_type", DEVICE_TYPES)
def test_the_best_checkpoints_by_metric_average_into_a_model_folder_that_validates(
    device_type: str, runs: Callable[[str], Path], tmp_path: Path
) -> None:
    run = runs(device_type)
    stray = run / "checkpoint-99.pth.tar"  # copied in by hand: not the run's, and ranked highest
    shutil.copyfile(run / "checkpoint-0.pth.tar", stray)
    state = torch.load(stray, weights_only=True)
    torch.save({**state, "metric": 1000.0}, stray)
    try:
        args = ["-m", "vtools", "avg-checkpoints", "--input", str(run), "--filter", "checkpoint-*.pth.tar", "-n", "2"]
        out = tmp_path / "avg.safetensors"
        proc = run_script([*args, "--output", str(out), "--safetensors", "--model-folder", str(tmp_path / "model")])
    finally:
        stray.unlink()
    assert proc.returncode == 0, proc.stderr
    assert "left out 1 file(s) the run's ledger does not list: checkpoint-99.pth.tar" in proc.stdout
    ranked = sorted((_metric(path), str(path)) for path in run.glob("checkpoint-*.pth.tar"))[-2:]
    loaded = [torch.load(name, weights_only=True)["state_dict_ema"] for _, name in ranked]
    averaged = load_file(str(out))
    assert set(averaged) == set(loaded[0])
    for key, value in averaged.items():
        assert torch.equal(value, ((loaded[0][key].double() + loaded[1][key].double()) / 2).float()), key
    assert hashlib.sha256(out.read_bytes()).hexdigest() in proc.stdout
    validated = run_script(["validate.py", str(_data_of(run)), "--model", str(tmp_path / "model"), "--workers", "0"])
    assert validated.returncode == 0, validated.stderr
    assert "samples" in validated.stdout


def _data_of(run: Path) -> Path:
    """The data folder the run trained on, as its config.yaml records it."""
    import yaml

    return Path(yaml.safe_load((run / "config.yaml").read_text())["data_dir"])


@pytest.mark.parametrize("device_type", DEVICE_TYPES)
@pytest.mark.parametrize("ema", [True, False])
def test_a_cleaned_checkpoint_is_the_runs_weights_under_its_hash(
    device_type: str, runs: Callable[[str], Path], tmp_path: Path, ema: bool
) -> None:
    run = runs(device_type)
    source = run / "model_best.pth.tar"
    args = ["-m", "vtools", "clean-checkpoint", "--checkpoint", str(source), "--output", str(tmp_path / "mine.pth")]
    proc = run_script([*args, *([] if ema else ["--no-use-ema"])])
    assert proc.returncode == 0, proc.stderr
    (written,) = tmp_path.glob("mine-*.pth")
    digest = hashlib.sha256(written.read_bytes()).hexdigest()
    assert written.name == f"mine-{digest[:8]}.pth" and digest in proc.stdout
    cleaned = torch.load(written, weights_only=True)
    trained = torch.load(source, weights_only=True)["state_dict_ema" if ema else "state_dict"]
    assert list(cleaned) == list(trained) and all(torch.equal(cleaned[key], trained[key]) for key in trained)


@pytest.mark.cpu_only(reason="input checks: one line before any checkpoint is read")
@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["avg-checkpoints", "--input", "{tmp}/none"], "--input {tmp}/none is not a folder"),
        (["avg-checkpoints", "--input", "{tmp}", "-n", "0"], "-n must be 1 or more"),
        (["avg-checkpoints", "--input", "{tmp}"], "no checkpoint in {tmp} matches --filter '*.pth.tar'"),
        (["avg-checkpoints", "--input", "{tmp}", "--output", "{tmp}/taken.pth"], "--output {tmp}/taken.pth already"),
        (["clean-checkpoint"], "--checkpoint (none given): no such file"),
        (["clean-checkpoint", "--checkpoint", "{tmp}/taken.pth", "--output", "{tmp}/taken.pth"], "already exists"),
    ],
)
def test_bad_input_is_one_line(args: list[str], words: str, tmp_path: Path) -> None:
    (tmp_path / "taken.pth").write_bytes(b"x")
    proc = run_script(["-m", "vtools", *(arg.format(tmp=tmp_path) for arg in args)])
    assert_one_line_error(proc, 2, words.format(tmp=tmp_path))
    assert (tmp_path / "taken.pth").read_bytes() == b"x"


@pytest.mark.parametrize("device_type", DEVICE_TYPES)
def test_validate_reads_what_avg_checkpoints_wrote(device_type: str, tmp_path: Path) -> None:
    make.three(tmp_path)
    args = ["-m", "vtools", "avg-checkpoints", "--input", str(tmp_path / "ck"), "--filter", "checkpoint-*.pth.tar"]
    averaged = run_script([*args, "-n", "2", "--output", str(tmp_path / "avg.pth")])
    assert averaged.returncode == 0, averaged.stderr
    validate = ["validate.py", str(make.DATA), "--model", "test_resnet", "--num-classes", "10", "--workers", "0"]
    proc = run_script([*validate, "--checkpoint", str(tmp_path / "avg.pth"), *device_flags(device_type)])
    assert proc.returncode == 0, proc.stderr
    assert "avg.pth" in proc.stdout


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs: too small for a test_resnet state dict (root only; the suite runs as root in CI)."""
    folder = tmp_path / "full"
    folder.mkdir()
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("mounting a small tmpfs needs root and a mount command")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(folder)], check=True)
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True)


@pytest.mark.cpu_only(reason="a full disk on the host; the weights are written from host memory")
@pytest.mark.parametrize("safetensors", [False, True])
def test_a_full_disk_is_one_line_and_leaves_nothing(full_disk: Path, tmp_path: Path, safetensors: bool) -> None:
    make.two(tmp_path)
    output = full_disk / ("avg.safetensors" if safetensors else "avg.pth")
    args = ["-m", "vtools", "avg-checkpoints", "--input", str(tmp_path / "ck"), "--filter", "checkpoint-*.pth.tar"]
    proc = run_script([*args, "--output", str(output), *(["--safetensors"] if safetensors else [])])
    assert_one_line_error(proc, 3, f"could not write {output} (No space left on device)")
    assert not list(full_disk.iterdir())


@pytest.mark.cpu_only(reason="file names and contents on the host")
def test_two_cleans_of_one_name_at_once_keep_their_own_contents(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second clean runs while the first is writing (called from inside its write): with one fixed
    staging name the second would write over the first's staging file, and the first would publish it."""
    from vtools.commands import clean_checkpoint

    make.save_checkpoint(tmp_path / "a" / "best.pth.tar", 70.0)
    (tmp_path / "b").mkdir()
    torch.save({"state_dict": {"w": torch.zeros(3)}}, tmp_path / "b" / "best.pth.tar")
    write = clean_checkpoint.write_weights
    nested: list[int] = []

    def write_and_interleave(state: dict, path: Path, safetensors: bool) -> None:
        write(state, path, safetensors)
        if not nested:  # the second clean, a one-tensor checkpoint of the same name, once
            nested.append(1)
            command_main("clean-checkpoint")(
                ["--checkpoint", str(tmp_path / "b" / "best.pth.tar"), "--output", str(out)]
            )

    out = tmp_path / "out" / "best.pth"
    monkeypatch.setattr(clean_checkpoint, "write_weights", write_and_interleave)
    command_main("clean-checkpoint")(["--checkpoint", str(tmp_path / "a" / "best.pth.tar"), "--output", str(out)])
    cleaned = {len(torch.load(path, weights_only=True)): path for path in (tmp_path / "out").glob("best-*.pth")}
    assert sorted(cleaned) == [1, len(torch.load(tmp_path / "a" / "best.pth.tar", weights_only=True)["state_dict"])]
    for path in cleaned.values():
        assert path.name == f"best-{hashlib.sha256(path.read_bytes()).hexdigest()[:8]}.pth"
    assert not [path for path in (tmp_path / "out").iterdir() if path.name.startswith(".")]


@pytest.mark.cpu_only(reason="reads .gitignore; runs nothing on a device")
def test_the_default_outputs_in_the_checkout_are_ignored_by_git() -> None:
    names = ["averaged.pth", "averaged.safetensors", "model_best.pth-1a2b3c4d.pth", "checkpoint-3.pth-0f.safetensors"]
    proc = subprocess.run(["git", "check-ignore", *names], cwd=REPO, capture_output=True, text=True)
    assert proc.stdout.split() == names, proc.stderr
