"""inference.py end to end, as subprocesses, on cpu and the emulated npu (and cuda when present)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import timm
import torch

from tests.conftest import DEVICE_TYPES, REPO, SYNSETS, assert_usage_error, device_flags, run_script


def run_inference(
    args: list[str], tmp_path: Path, formats: tuple[str, ...] = ("json",), env: dict | None = None
) -> tuple[str, dict[str, Path]]:
    out = tmp_path / "results"
    proc = run_script(
        ["inference.py", *args, "--results-dir", str(out), "--results-file", "preds", "--results-format", *formats],
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout, {fmt: out / f"preds.{fmt}" for fmt in formats}


def test_devices_agree_and_match_the_model(synset_images: Path, imagenet_model_dir: Path, tmp_path: Path) -> None:
    rows_by_device = {}
    for device_type in DEVICE_TYPES:
        _, files = run_inference(
            [
                str(synset_images),
                *device_flags(device_type),
                "--model",
                str(imagenet_model_dir),
                "--topk",
                "5",
                "--label-type",
                "name",
                "--include-index",
            ],
            tmp_path / device_type,
        )
        rows_by_device[device_type] = json.loads(files["json"].read_text())
    cpu = rows_by_device["cpu"]
    assert len(cpu) == 12 and all(len(row["index"]) == 5 for row in cpu)
    synsets = timm.data.ImageNetInfo().label_names()
    assert all(row["label"] == [synsets[i] for i in row["index"]] for row in cpu)
    for device_type, rows in rows_by_device.items():
        for a, b in zip(cpu, rows):
            assert a["filename"] == b["filename"] and a["index"] == b["index"], device_type
            assert a["prob"] == pytest.approx(b["prob"], abs=1e-4), device_type
    # the probabilities are the model's own softmax on timm's preprocessing
    model = timm.create_model(f"local-dir:{imagenet_model_dir}", pretrained=True).eval()
    config = timm.data.resolve_data_config(model=model)
    from PIL import Image

    image = Image.open(synset_images / SYNSETS[0] / f"{SYNSETS[0]}_0.jpg").convert("RGB")
    with torch.no_grad():
        probs = model(timm.data.create_transform(**config)(image)[None]).softmax(1)[0]
    top = probs.topk(5)
    first = next(row for row in cpu if row["filename"] == f"{SYNSETS[0]}_0.jpg")
    assert first["index"] == top.indices.tolist()
    assert first["prob"] == pytest.approx(top.values.tolist(), abs=1e-5)


@pytest.mark.parametrize(
    "label_type, expected",
    [("name", "n01440764"), ("description", "tench, Tinca tinca"), ("detail", "freshwater dace-like game fish")],
)
@pytest.mark.cpu_only(reason="label lookup is host-side; npu predictions: test_devices_agree_and_match_the_model")
def test_imagenet_label_types(
    label_type: str, expected: str, synset_images: Path, imagenet_model_dir: Path, tmp_path: Path
) -> None:
    _, files = run_inference(
        [
            str(synset_images),
            "--device",
            "cpu",
            "--model",
            str(imagenet_model_dir),
            "--topk",
            "1000",
            "--label-type",
            label_type,
        ],
        tmp_path,
    )
    labels = json.loads(files["json"].read_text())[0]["label"]
    assert len(labels) == 1000 and any(expected in label for label in labels)


@pytest.mark.cpu_only(reason="result formatting is host-side")
def test_formats_parse_with_pandas(custom_images: Path, custom_model_dir: Path, tmp_path: Path) -> None:
    stdout, files = run_inference(
        [
            str(custom_images),
            "--device",
            "cpu",
            "--model",
            str(custom_model_dir),
            "--topk",
            "2",
            "--label-type",
            "name",
            "--fullname",
        ],
        tmp_path,
        formats=("csv", "json", "jsonl"),
    )
    table = pd.read_csv(files["csv"])
    assert list(table.columns) == ["filename", "label_1", "label_2", "prob_1", "prob_2"]
    assert len(table) == 12 and set(table["label_1"]) <= {"cat", "dog", "fox"}
    assert (table["prob_1"] >= table["prob_2"]).all()
    assert all(Path(name).is_absolute() for name in table["filename"])
    assert pd.read_json(files["jsonl"], lines=True).shape == (12, 3)
    assert pd.read_json(files["json"]).shape == (12, 3)
    assert "results written to" in stdout


@pytest.mark.parametrize("device_type", DEVICE_TYPES)
def test_full_vector_logits(device_type: str, custom_images: Path, custom_model_dir: Path, tmp_path: Path) -> None:
    _, files = run_inference(
        [
            str(custom_images),
            *device_flags(device_type),
            "--model",
            str(custom_model_dir),
            "--topk",
            "0",
            "--output-type",
            "logit",
            "--label-type",
            "name",
        ],
        tmp_path,
        formats=("csv",),
    )
    table = pd.read_csv(files["csv"])
    assert list(table.columns) == ["filename", "logit:cat", "logit:dog", "logit:fox"]
    assert not table[["logit:cat", "logit:dog", "logit:fox"]].sum(axis=1).round(4).eq(1.0).all()


@pytest.mark.parametrize("kind", ["folder", "glob", "list", "single"])
@pytest.mark.cpu_only(reason="image discovery is host-side")
def test_sources(kind: str, custom_images: Path, custom_model_dir: Path, tmp_path: Path) -> None:
    flat = tmp_path / "flat"
    flat.mkdir()
    for file in sorted(custom_images.rglob("*.*"))[:5]:
        (flat / file.name).write_bytes(file.read_bytes())
    if kind == "folder":
        source, count = str(flat), 5
    elif kind == "glob":
        source, count = str(custom_images / "*" / "*.png"), 6
    elif kind == "list":
        listing = tmp_path / "list.txt"
        listing.write_text("\n".join(f"flat/{p.name}" for p in sorted(flat.iterdir())[:3]) + "\n")
        source, count = str(listing), 3
    else:
        source, count = str(next(flat.iterdir())), 1
    _, files = run_inference([source, "--device", "cpu", "--model", str(custom_model_dir), "--topk", "1"], tmp_path)
    rows = json.loads(files["json"].read_text())
    assert len(rows) == count and isinstance(rows[0]["prob"], float)


# ---------------------------------------------------------------- a corrupt image: one line, or skipped
# (one line and nothing written; the other bad input, one line each: tests/scripts/test_one_line_errors.py)


@pytest.mark.parametrize("device_type", DEVICE_TYPES)
def test_corrupt_image(device_type: str, custom_images: Path, custom_model_dir: Path, tmp_path: Path) -> None:
    folder = tmp_path / "imgs"
    folder.mkdir()
    good = sorted(custom_images.rglob("*.png"))[0]
    (folder / "good.png").write_bytes(good.read_bytes())
    (folder / "broken.png").write_bytes(good.read_bytes()[:100])
    out = tmp_path / "out"
    proc = run_script(
        ["inference.py", str(folder), *device_flags(device_type), "--model", str(custom_model_dir)]
        + ["--results-dir", str(out)]
    )
    assert_usage_error(proc, "broken.png")
    assert not out.exists() or not any(out.glob("*.csv"))
    stdout, files = run_inference(
        [str(folder), *device_flags(device_type), "--model", str(custom_model_dir), "--on-bad-image", "skip"], tmp_path
    )
    assert [row["filename"] for row in json.loads(files["json"].read_text())] == ["good.png"]
    assert "1 unreadable skipped" in stdout


@pytest.mark.cpu_only(reason="where results are written is host-side")
def test_results_land_in_the_current_folder_by_default(
    custom_images: Path, custom_model_dir: Path, tmp_path: Path
) -> None:
    """Like timm's inference.py: without --results-dir/--results-file the predictions are still saved."""
    proc = run_script(
        [
            str(REPO / "inference.py"),
            str(custom_images),
            "--device",
            "cpu",
            "--model",
            str(custom_model_dir),
            "--topk",
            "2",
        ],
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    name = f"{custom_model_dir.parent.name}-topk2.csv"  # a folder called model/ is named after its parent
    assert f"results written to {name}" in proc.stdout
    assert len(pd.read_csv(tmp_path / name)) == 12


@pytest.mark.cpu_only(reason="console output is host-side")
def test_no_console_results(custom_images: Path, custom_model_dir: Path, tmp_path: Path) -> None:
    stdout, files = run_inference(
        [str(custom_images), "--device", "cpu", "--model", str(custom_model_dir), "--no-console-results"], tmp_path
    )
    assert "filename" not in stdout and "12 images classified" in stdout
    assert len(json.loads(files["json"].read_text())) == 12
