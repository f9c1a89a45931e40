"""Setups and checks of checkpoint_tools.yaml: small training checkpoints of timm's ``test_resnet`` (random
weights, saved as timm's CheckpointSaver saves them: ``state_dict``, ``metric``, ``epoch``), made in a moment,
so that every case runs the whole command without training."""

from __future__ import annotations

import subprocess
from pathlib import Path

import timm
import torch

from tests.conftest import run_script

DATA = Path(__file__).resolve().parents[3] / "data" / "fashion-mnist-mini"


def save_checkpoint(
    path: Path, metric: object = 70.0, num_classes: int = 10, model: str = "test_resnet", legacy: bool = False
) -> None:
    """A checkpoint as timm's saver writes it; ``legacy``: in torch.save's old, non-zip format."""
    torch.manual_seed(hash(path.name) % 1000)
    state = timm.create_model(model, num_classes=num_classes).state_dict()
    path.parent.mkdir(parents=True, exist_ok=True)
    contents = {"epoch": 1, "arch": model, "state_dict": state, "metric": metric}
    torch.save(contents, path, _use_new_zipfile_serialization=not legacy)


def three(tmp: Path) -> None:
    """Three checkpoints of one model, metrics 70, 72 and 71."""
    for epoch, metric in enumerate((70.0, 72.0, 71.0)):
        save_checkpoint(tmp / "ck" / f"checkpoint-{epoch}.pth.tar", metric)


def two(tmp: Path) -> None:
    """Two checkpoints of one model."""
    for epoch, metric in enumerate((70.0, 72.0)):
        save_checkpoint(tmp / "ck" / f"checkpoint-{epoch}.pth.tar", metric)


def two_heads(tmp: Path) -> None:
    """Two checkpoints of one architecture with 10 and 16 classes."""
    save_checkpoint(tmp / "ck" / "checkpoint-0.pth.tar", 70.0, num_classes=10)
    save_checkpoint(tmp / "ck" / "checkpoint-1.pth.tar", 71.0, num_classes=16)


def two_architectures(tmp: Path) -> None:
    """A test_resnet and a test_efficientnet checkpoint."""
    save_checkpoint(tmp / "ck" / "checkpoint-0.pth.tar", 70.0)
    save_checkpoint(tmp / "ck" / "checkpoint-1.pth.tar", 71.0, model="test_efficientnet")


def string_metric(tmp: Path) -> None:
    """A checkpoint whose metric is a string, beside a sound one."""
    save_checkpoint(tmp / "ck" / "checkpoint-0.pth.tar", 70.0)
    save_checkpoint(tmp / "ck" / "checkpoint-1.pth.tar", "abc")


def pair_metric(tmp: Path) -> None:
    """A checkpoint whose metric is a tensor of two values, beside a sound one."""
    save_checkpoint(tmp / "ck" / "checkpoint-0.pth.tar", 70.0)
    save_checkpoint(tmp / "ck" / "checkpoint-1.pth.tar", torch.tensor([70.0, 71.0]))


def nan_metric(tmp: Path) -> None:
    """Three checkpoints, the one with a NaN metric named so that it sorts last (where NaN lands)."""
    save_checkpoint(tmp / "ck" / "checkpoint-0.pth.tar", 70.0)
    save_checkpoint(tmp / "ck" / "checkpoint-1.pth.tar", 72.0)
    save_checkpoint(tmp / "ck" / "checkpoint-2.pth.tar", float("nan"))


def legacy(tmp: Path) -> None:
    """Two checkpoints in torch.save's legacy (non-zip) format, as older torch and timm wrote them."""
    for epoch, metric in enumerate((70.0, 72.0)):
        save_checkpoint(tmp / "ck" / f"checkpoint-{epoch}.pth.tar", metric, legacy=True)


def run_folder(tmp: Path) -> None:
    """A vtools run folder (``run``) of two ledger-listed checkpoints and a model/config.json, its ledger
    as a finished run leaves it (a pid line, then the files), and a stray checkpoint outside it (``stray``)."""
    from vtools.run_ledger import LOCK_NAME

    run = tmp / "run"
    two(tmp)
    (tmp / "ck").rename(run)
    (run / "model").mkdir()
    (run / "model" / "config.json").write_text('{"architecture": "test_resnet", "num_classes": 10}')
    (run / LOCK_NAME).write_text("4242\nmodel/config.json\ncheckpoint-0.pth.tar\ncheckpoint-1.pth.tar\n")
    save_checkpoint(tmp / "stray" / "checkpoint-5.pth.tar", 99.0)


def run_folder_and_model_folder(tmp: Path) -> None:
    """:func:`run_folder`, and a user's model folder at ``mine`` that must stay as it is."""
    run_folder(tmp)
    (tmp / "mine").mkdir()
    (tmp / "mine" / "config.json").write_text('{"architecture": "efficientnet_b0"}')
    (tmp / "mine" / "pytorch_model.bin").write_bytes(b"user weights")


def timm_averaged(tmp: Path) -> None:
    """What timm's avg_checkpoints.py writes: every tensor float32, num_batches_tracked included."""
    state = timm.create_model("test_resnet", num_classes=10).state_dict()
    torch.save({key: value.float() for key, value in state.items()}, tmp / "timm-avg.pth")


def staging_name_taken(tmp: Path) -> None:
    """A checkpoint, and a user's file named as the old fixed staging name of its cleaned file."""
    save_checkpoint(tmp / "ck" / "best.pth.tar", 70.0)
    (tmp / ".best.pth.cleaning").write_bytes(b"a user's file")


def validates(tmp: Path, proc: subprocess.CompletedProcess) -> None:
    """The averaged weights, counts float32 as timm's script writes them, pass validate.py --checkpoint."""
    weights = next(path for name in ("avg.pth", "avg.safetensors") if (path := tmp / name).is_file())
    args = ["validate.py", str(DATA), "--model", "test_resnet", "--num-classes", "10", "--checkpoint", str(weights)]
    validated = run_script([*args, "--workers", "0", "--batch-size", "100"])
    assert validated.returncode == 0, validated.stderr
    counts = {key: value for key, value in _load(weights).items() if key.endswith("num_batches_tracked")}
    assert counts and all(value.dtype == torch.float32 for value in counts.values()), counts


def _load(path: Path) -> dict[str, torch.Tensor]:
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    return torch.load(path, weights_only=True)


def averaged_two_best(tmp: Path, proc: subprocess.CompletedProcess) -> None:
    """The NaN checkpoint is not among those averaged: the result is the mean of the 70 and 72 ones."""
    states = [torch.load(tmp / "ck" / f"checkpoint-{i}.pth.tar", weights_only=True)["state_dict"] for i in (0, 1)]
    averaged = torch.load(tmp / "avg.pth", weights_only=True)
    key = "fc.weight"
    assert torch.equal(averaged[key], ((states[0][key].double() + states[1][key].double()) / 2).float())


def no_staging_left(tmp: Path, proc: subprocess.CompletedProcess) -> None:
    """One cleaned file in the current folder, and no staging file beside the user's."""
    assert len(list(tmp.glob("best.pth-*.pth"))) == 1
    assert sorted(path.name for path in tmp.iterdir() if path.name.startswith(".")) == [".best.pth.cleaning"]


def nothing_cleaned(tmp: Path, proc: subprocess.CompletedProcess) -> None:
    """A refused clean writes no file, under any name."""
    assert not list(tmp.glob("clean*"))
