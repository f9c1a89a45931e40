"""ONNX export proves its parity, and the exported file validates and predicts like the PyTorch model.

The reference is onnxruntime itself: the export's own check is re-done here with
an independent onnxruntime session on the shipped real images.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from tests.conftest import (
    DEVICE_TYPES,
    REPO,
    assert_usage_error,
    device_flags,
    run_script,
    train_args,
)

SHIPPED_VAL = REPO / "data" / "fashion-mnist-mini" / "val"


def _export(*args: str) -> object:
    return run_script(["-m", "vtools", "export", *args])


@pytest.fixture(scope="module")
def exported_folder(fashion4: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The model folder of a real (short) train.py run, with its model.onnx."""
    out = tmp_path_factory.mktemp("export")
    trained = run_script(train_args(fashion4, out, "run", "--device", "cpu", "--epochs", "2"))
    assert trained.returncode == 0, trained.stderr
    folder = out / "run" / "model"
    proc = _export(str(folder), "--data", str(fashion4 / "val"))
    assert proc.returncode == 0, proc.stderr
    assert "same top-5 on 100.0 %" in proc.stdout
    return folder


def _independent_parity(
    onnx_path: Path, model: torch.nn.Module, size: tuple[int, ...], data: Path = SHIPPED_VAL
) -> float:
    """Max logit difference between PyTorch and a fresh onnxruntime session on real, preprocessed images."""
    import onnxruntime
    from timm.data import resolve_data_config

    from vtools.deploy.export import check_images

    config = resolve_data_config(model=model)
    images = check_images(str(data), config, 16)
    assert images.shape[1:] == size
    session = onnxruntime.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    (logits,) = session.run(None, {session.get_inputs()[0].name: images.numpy()})
    with torch.no_grad():
        return float(np.abs(model(images).numpy() - logits).max())


@pytest.mark.cpu_only(
    reason="export runs on the host; the exported file's device runs: test_validate_onnx_equals_pytorch"
)
def test_model_folder_export_matches_onnxruntime(exported_folder: Path, fashion4: Path) -> None:
    from vtools.models.create import create_model

    model = create_model(str(exported_folder)).eval()
    assert _independent_parity(exported_folder / "model.onnx", model, (3, 32, 32), fashion4 / "val") < 1e-4


@pytest.mark.cpu_only(reason="export runs on the host")
@pytest.mark.parametrize("name", ["test_resnet", "test_vit"])
def test_timm_cnn_and_vit_export(name: str, tmp_path: Path) -> None:
    """A random-init timm CNN and ViT, given as name + --checkpoint; the default output lands beside it."""
    import timm
    from safetensors.torch import save_file

    torch.manual_seed(7)
    model = timm.create_model(name, num_classes=10).eval()
    checkpoint = tmp_path / f"{name}.safetensors"
    save_file(model.state_dict(), str(checkpoint))
    proc = _export(name, "--num-classes", "10", "--checkpoint", str(checkpoint), "--data", str(SHIPPED_VAL))
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / f"{name}.onnx"
    assert f"wrote {out}" in proc.stdout
    assert _independent_parity(out, model, tuple(model.pretrained_cfg["input_size"])) < 1e-4


@pytest.mark.cpu_only(reason="export runs on the host")
def test_opset_18_uses_the_torch_export_exporter(tmp_path: Path) -> None:
    import onnx

    out = tmp_path / "resnet.onnx"
    proc = _export(
        "test_resnet",
        "--num-classes",
        "10",
        "--data",
        str(SHIPPED_VAL),
        "--output",
        str(out),
        "--opset",
        "18",
        "--check-images",
        "8",
    )
    assert proc.returncode == 0, proc.stderr
    assert max(op.version for op in onnx.load(str(out)).opset_import if op.domain in ("", "ai.onnx")) == 18


@pytest.mark.cpu_only(reason="export runs on the host")
def test_a_wrong_exported_file_is_refused_and_leaves_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The exporter writes another model's weights (a broken export): the check against PyTorch must catch
    it every time, end the command with one line (exit 3 through the runner), and leave neither the output
    nor its staging file. A check that always passes fails here; nothing here can skip."""
    import timm

    from vtools.cli.runner import command_main
    from vtools.commands import export as command
    from vtools.errors import RunFailed

    real_write = command.write_onnx

    def write_another_model(model: torch.nn.Module, example: torch.Tensor, path: Path, opset: int) -> None:
        torch.manual_seed(1234)
        real_write(timm.create_model("test_resnet", num_classes=10).eval(), example, path, opset)

    monkeypatch.setattr(command, "write_onnx", write_another_model)
    out = tmp_path / "never.onnx"
    torch.manual_seed(0)
    argv = ["test_resnet", "--num-classes", "10", "--data", str(SHIPPED_VAL), "--output", str(out)]
    with pytest.raises(RunFailed) as failure:
        command_main("export")([*argv, "--check-images", "4"])
    assert "does not match PyTorch" in str(failure.value) and "nothing written" in str(failure.value)
    assert "\n" not in str(failure.value)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.cpu_only(reason="export runs on the host")
def test_the_parity_check_measures_the_difference(tmp_path: Path) -> None:
    """compare() on the model's own export: logits equal within float noise, same top-5; on another
    model's export: the difference is the one PyTorch computes between the two models."""
    import timm

    from vtools.deploy.export import compare, write_onnx

    torch.manual_seed(0)
    model, other = (timm.create_model("test_resnet", num_classes=10).eval() for _ in range(2))
    images = torch.rand(4, 3, 160, 160)
    write_onnx(model, images[:2], tmp_path / "own.onnx", 17)
    write_onnx(other, images[:2], tmp_path / "other.onnx", 17)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # onnxruntime warns when the CPU provider is not asked for by its name
        difference, scale, same_top = compare(model, tmp_path / "own.onnx", images)
    with torch.no_grad():
        expected = (model(images) - other(images)).abs().max().item()
        largest = model(images).abs().max().item()
    assert difference < 1e-4 and same_top == 1.0 and scale == pytest.approx(largest)
    difference, _, _ = compare(model, tmp_path / "other.onnx", images)
    assert difference == pytest.approx(expected, rel=1e-3)


@pytest.mark.cpu_only(reason="export runs on the host")
def test_the_same_top5_fraction_counts_images_whose_top5_agree_in_order(tmp_path: Path) -> None:
    """Three images whose logits are rows of a weight matrix: the export of a second matrix agrees on image
    0's top 5 but not its 6th, on all of image 1, and on image 2's top 3 but not its 4th: 2 of 3 agree."""
    from vtools.deploy.export import compare, write_onnx

    ranks = torch.tensor([8.0, 7, 6, 5, 4, 3, 2, 1])
    ours = torch.stack([ranks, ranks, ranks])
    theirs = ours.clone()
    theirs[0, [5, 6]] = theirs[0, [6, 5]]  # the 6th and 7th swap
    theirs[2, [3, 4]] = theirs[2, [4, 3]]  # the 4th and 5th swap
    models = []
    for logits in (ours, theirs):
        model = torch.nn.Linear(3, 8, bias=False).eval()
        with torch.no_grad():
            model.weight.copy_(logits.T)  # image i (one-hot) -> row i
        models.append(model)
    images = torch.eye(3)
    write_onnx(models[1], images[:1], tmp_path / "theirs.onnx", 17)
    difference, scale, same_top = compare(models[0], tmp_path / "theirs.onnx", images)
    assert (difference, scale) == (1.0, 8.0)
    assert same_top == pytest.approx(2 / 3)


@pytest.mark.cpu_only(reason="input checks")
def test_missing_onnxruntime_names_the_install(tmp_path: Path, exported_folder: Path) -> None:
    shadow = tmp_path / "onnxruntime"
    shadow.mkdir()
    (shadow / "__init__.py").write_text("raise ImportError('No module named onnxruntime')\n")
    proc = run_script(
        ["validate.py", str(SHIPPED_VAL), "--model", str(exported_folder / "model.onnx"), "--device", "cpu"],
        env={"PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}"},
    )
    assert_usage_error(proc, "needs the package onnxruntime", "requirements-deploy.txt")


def _run_for_torch_and_onnx(
    folder: Path, script: str, data: Path, device_type: str, suffix: str, *extra: str
) -> dict[str, Path]:
    """Run ``script`` on the PyTorch model folder and on its model.onnx; returns each results file."""
    results = {}
    for kind, model in (("torch", folder), ("onnx", folder / "model.onnx")):
        results[kind] = folder.parent.parent / f"{script}-{device_type}-{kind}.{suffix}"
        proc = run_script(
            [
                script,
                str(data),
                "--model",
                str(model),
                *device_flags(device_type),
                *extra,
                "--results-file",
                str(results[kind]),
            ]
        )
        assert proc.returncode == 0, proc.stderr
    return results


@pytest.mark.parametrize("device_type", DEVICE_TYPES)
def test_validate_onnx_equals_pytorch(device_type: str, exported_folder: Path, fashion4: Path) -> None:
    files = _run_for_torch_and_onnx(
        exported_folder, "validate.py", fashion4 / "val", device_type, "json", "--results-format", "json"
    )
    rows = {kind: json.loads(path.read_text())[0] for kind, path in files.items()}
    assert rows["onnx"]["samples"] == rows["torch"]["samples"] == 60
    for key in ("top1", "top5"):
        assert rows["onnx"][key] == rows["torch"][key], key
    assert rows["onnx"]["loss"] == pytest.approx(rows["torch"]["loss"], abs=1e-4)
    # the graph's weights, as torch counts its parameters (an .onnx row once said 0)
    assert rows["onnx"]["param_count"] == pytest.approx(rows["torch"]["param_count"], rel=0.05)
    assert rows["onnx"]["param_count"] > 0


@pytest.mark.parametrize("device_type", DEVICE_TYPES)
def test_inference_onnx_gives_the_same_top5(device_type: str, exported_folder: Path, fashion4: Path) -> None:
    files = _run_for_torch_and_onnx(
        exported_folder, "inference.py", fashion4 / "val", device_type, "csv", "--topk", "4"
    )
    tables = {kind: pd.read_csv(path) for kind, path in files.items()}
    labels = [f"label_{k}" for k in range(1, 5)]  # every class of the 4: the whole ranking
    assert len(tables["onnx"]) == 60
    assert tables["onnx"][["filename", *labels]].equals(tables["torch"][["filename", *labels]])
    probs = [f"prob_{k}" for k in range(1, 5)]
    assert np.allclose(tables["onnx"][probs].to_numpy(), tables["torch"][probs].to_numpy(), atol=1e-5)
