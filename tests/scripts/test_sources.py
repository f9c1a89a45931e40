"""Tar shards (wds/) and Hugging Face tables (hfds/) behave exactly as the same images in folders.

The subset of the shipped Fashion-MNIST images is converted with ``python -m
vtools shards`` (to shards and to parquet); validation numbers, training curves
and predictions must equal the folder's, on every device. What the converter
writes is read back with webdataset's and datasets' own readers, not ours.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import tarfile
from pathlib import Path

import pytest
from PIL import Image

from tests.conftest import (
    DEVICE_TYPES,
    REPO,
    assert_same_weights,
    assert_usage_error,
    device_flags,
    run_script,
    start_script,
    summary,
    torchrun,
    train_args,
    weights,
    write_model_folder,
)

FORMATS = {"wds": "wds/fashion4", "parquet": "hfds/fashion4"}


def _convert(source: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    return run_script(["-m", "vtools", "shards", str(source), str(out), *extra])


@pytest.fixture(scope="session")
def stores(fashion4: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """fashion4 as tar shards (several per split, uneven last shard) and as parquet."""
    root = tmp_path_factory.mktemp("stores")
    made = {}
    for fmt in FORMATS:
        proc = _convert(fashion4, root / fmt, "--format", fmt, "--shard-size", "70", "--name", "fashion4")
        assert proc.returncode == 0, proc.stderr
        made[fmt] = root / fmt
    return made


def _source_flags(kind: str, stores: dict[str, Path], fashion4: Path) -> list[str]:
    if kind == "folder":
        return ["--data-dir", str(fashion4)]
    return ["--dataset", FORMATS[kind], "--data-dir", str(stores[kind])]


def _model_folder(fashion4: Path, folder: Path, seed: int = 0) -> Path:
    """A random-init model folder whose class names are the subset's."""
    classes = sorted(p.name for p in (fashion4 / "val").iterdir())
    return write_model_folder(folder, len(classes), classes, seed=seed)


# ---------------------------------------------------------------- the converter


@pytest.mark.cpu_only(reason="conversion is host-side file work")
def test_shards_hold_the_folder_as_webdataset_reads_it(fashion4: Path, stores: dict[str, Path]) -> None:
    import webdataset

    info = json.loads((stores["wds"] / "_info.json").read_text())
    classes = sorted(p.name for p in (fashion4 / "train").iterdir())
    assert info["classes"] == classes
    train = info["splits"]["train"]
    assert train["shard_lengths"] == [70, 70, 70, 30] and train["num_samples"] == 240
    assert info["splits"]["validation"]["num_samples"] == 60
    urls = [str(stores["wds"] / name) for name in train["filenames"]]
    read = list(webdataset.WebDataset(urls, shardshuffle=False, empty_check=False))
    assert len(read) == 240
    for sample in read:
        meta = json.loads(sample["json"])
        original = fashion4 / "train" / meta["filename"]
        assert sample["png"] == original.read_bytes()
        assert int(sample["cls"]) == classes.index(original.parent.name) == meta["label"]


@pytest.mark.cpu_only(reason="conversion is host-side file work")
def test_parquet_reads_back_with_class_names(fashion4: Path, stores: dict[str, Path]) -> None:
    datasets = pytest.importorskip("datasets")

    table = datasets.load_dataset(str(stores["parquet"]), split="validation")
    assert table.features["label"].names == sorted(p.name for p in (fashion4 / "val").iterdir())
    assert len(table) == 60


@pytest.mark.cpu_only(reason="conversion is host-side file work")
def test_max_side_resizes_and_bad_input_leaves_nothing(fashion4: Path, tmp_path: Path) -> None:
    big = tmp_path / "big" / "train"
    (big / "cat").mkdir(parents=True)
    Image.new("RGB", (400, 200), (200, 30, 30)).save(big / "cat" / "wide.jpg")
    Image.new("L", (50, 80), 90).save(big / "cat" / "small.png")
    proc = _convert(big.parent, tmp_path / "out", "--max-side", "100")
    assert proc.returncode == 0, proc.stderr
    with tarfile.open(tmp_path / "out" / "out-train-000000.tar") as tar:
        sizes = {
            m.name.rsplit(".", 1)[1]: Image.open(io.BytesIO(tar.extractfile(m).read())).size
            for m in tar.getmembers()
            if m.name.endswith((".jpg", ".png"))
        }
    assert sizes == {"jpg": (100, 50), "png": (50, 80)}  # only the large one re-encoded

    (big / "cat" / "broken.jpg").write_bytes(b"not a jpeg")
    failed = _convert(big.parent, tmp_path / "never", "--max-side", "100")
    assert_usage_error(failed, "broken.jpg", "cannot read image")
    assert not (tmp_path / "never").exists()
    assert not [p for p in tmp_path.iterdir() if "partial" in p.name]
    assert_usage_error(_convert(big.parent, tmp_path / "out"), "already exists and is not empty")


# ---------------------------------------------------------------- the same numbers from every store


@pytest.mark.parametrize("device_type", DEVICE_TYPES)
def test_validate_gives_the_folder_numbers(
    device_type: str, fashion4: Path, stores: dict[str, Path], tmp_path: Path
) -> None:
    model = _model_folder(fashion4, tmp_path / "model", seed=3)
    rows = {}
    for kind in ("folder", "wds", "parquet"):
        results = tmp_path / f"{kind}.json"
        proc = run_script(
            [
                "validate.py",
                *_source_flags(kind, stores, fashion4),
                "--model",
                str(model),
                *device_flags(device_type),
                "--results-file",
                str(results),
                "--results-format",
                "json",
            ]
        )
        assert proc.returncode == 0, proc.stderr
        rows[kind] = json.loads(results.read_text())[0]
    for kind in ("wds", "parquet"):
        for key in ("top1", "top5", "loss", "samples"):
            assert rows[kind][key] == rows["folder"][key], (kind, key)
    assert rows["folder"]["samples"] == 60


@pytest.mark.parametrize("device_type", DEVICE_TYPES)
def test_training_curve_is_the_folder_curve(
    device_type: str, fashion4: Path, stores: dict[str, Path], tmp_path: Path
) -> None:
    """Same seed, same order, same augmentation: shards and tables give the folder's run exactly."""
    runs = {}
    for kind in ("folder", "wds", "parquet"):
        proc = run_script(
            train_args(
                Path("unused"),
                tmp_path,
                kind,
                *device_flags(device_type),
                "--epochs",
                "2",
                *_source_flags(kind, stores, fashion4),
            )
        )
        assert proc.returncode == 0, proc.stderr
        runs[kind] = summary(tmp_path / kind)
    for kind in ("wds", "parquet"):
        for ours, folder in zip(runs[kind], runs["folder"]):
            for key in ("train_loss", "eval_loss", "eval_top1", "eval_top5", "lr", "eval_samples"):
                assert ours[key] == folder[key], (kind, key, ours[key], folder[key])
    assert_same_weights(weights(tmp_path / "folder" / "last.pth.tar"), weights(tmp_path / "wds" / "last.pth.tar"))


@pytest.mark.parametrize("device_type", DEVICE_TYPES)
def test_inference_predicts_the_same_labels(
    device_type: str, fashion4: Path, stores: dict[str, Path], tmp_path: Path
) -> None:
    model = _model_folder(fashion4, tmp_path / "model", seed=4)
    predictions = {}
    for kind, flags in (
        ("folder", [str(fashion4 / "val")]),
        ("wds", ["--dataset", FORMATS["wds"], "--data-dir", str(stores["wds"])]),
    ):
        out = tmp_path / f"{kind}.csv"
        proc = run_script(
            [
                "inference.py",
                *flags,
                "--model",
                str(model),
                "--topk",
                "3",
                *device_flags(device_type),
                "--results-file",
                str(out),
            ]
        )
        assert proc.returncode == 0, proc.stderr
        predictions[kind] = out.read_text().splitlines()[1:]
    # the folder is listed class by class in sorted order, as the converter wrote it
    assert [row.split(",", 1)[1] for row in predictions["wds"]] == [
        row.split(",", 1)[1] for row in predictions["folder"]
    ]
    assert predictions["wds"][0].startswith("fashion4-validation-000000.tar:000000000,")


# ---------------------------------------------------------------- ImageNet as timm and Hugging Face publish it


def _imagenet_samples(synset_images: Path) -> list[tuple[Path, int]]:
    from timm.data import ImageNetInfo

    synsets = list(ImageNetInfo("imagenet-1k").label_names())
    return [(path, synsets.index(path.parent.name)) for path in sorted(synset_images.rglob("*.*"))]


def _timm_published_shards(synset_images: Path, root: Path) -> Path:
    """timm's imagenet-1k-wds layout: _info.json without class names, keys that are ImageNet file stems,
    .jpg/.cls/.json members, shards named imagenet1k-validation-NN.tar."""
    from webdataset import TarWriter

    samples = _imagenet_samples(synset_images)
    root.mkdir(parents=True)
    filenames, lengths = [], []
    for shard, start in enumerate(range(0, len(samples), 5)):
        filenames.append(f"imagenet1k-validation-{shard:02d}.tar")
        chunk = samples[start : start + 5]
        lengths.append(len(chunk))
        with TarWriter(str(root / filenames[-1])) as writer:
            for path, label in chunk:
                image = io.BytesIO()
                Image.open(path).convert("RGB").save(image, format="JPEG", quality=95)
                writer.write(
                    {
                        "__key__": path.stem,
                        "jpg": image.getvalue(),
                        "cls": str(label).encode(),
                        "json": json.dumps({"filename": path.stem + ".JPEG", "label": label}).encode(),
                    }
                )
    info = {
        "name": "imagenet-1k",
        "splits": {
            "validation": {
                "name": "validation",
                "num_samples": len(samples),
                "filenames": filenames,
                "shard_lengths": lengths,
            }
        },
    }
    (root / "_info.json").write_text(json.dumps(info))
    return root


@pytest.mark.parametrize("device_type", DEVICE_TYPES)
def test_timm_published_imagenet_shards_work_as_downloaded(
    device_type: str, synset_images: Path, imagenet_model_dir: Path, tmp_path: Path
) -> None:
    shards = _timm_published_shards(synset_images, tmp_path / "imagenet-1k-wds")
    jpeg_folder = tmp_path / "folder"
    for path, _ in _imagenet_samples(synset_images):  # the same JPEG bytes as a folder, for the reference
        (jpeg_folder / path.parent.name).mkdir(parents=True, exist_ok=True)
    for shard in sorted(shards.glob("*.tar")):
        with tarfile.open(shard) as tar:
            for member in tar.getmembers():
                if member.name.endswith(".jpg"):
                    synset = member.name.split("_")[0]
                    (jpeg_folder / synset / member.name).write_bytes(tar.extractfile(member).read())
    rows = {}
    pattern = [
        "--dataset",
        "wds/imagenet-1k",
        "--data-dir",
        str(shards),
        "--split",
        "imagenet1k-validation-{00..02}.tar",
    ]
    for kind, flags in (
        ("folder", [str(jpeg_folder)]),
        ("wds", ["--dataset", "wds/imagenet-1k", "--data-dir", str(shards)]),
        *([("pattern", pattern)] if device_type == "cpu" else []),
    ):  # naming shards: host-side
        results = tmp_path / f"{kind}.json"
        proc = run_script(
            [
                "validate.py",
                *flags,
                "--model",
                str(imagenet_model_dir),
                *device_flags(device_type),
                "--results-file",
                str(results),
                "--results-format",
                "json",
            ]
        )
        assert proc.returncode == 0, proc.stderr
        rows[kind] = json.loads(results.read_text())[0]
    assert rows["folder"]["samples"] == len(_imagenet_samples(synset_images))
    for kind in set(rows) - {"folder"}:
        assert {k: rows[kind][k] for k in ("top1", "top5", "loss", "samples")} == {
            k: rows["folder"][k] for k in ("top1", "top5", "loss", "samples")
        }


@pytest.mark.cpu_only(reason="the layout is read on the host; device parity: test_validate_gives_the_folder_numbers")
def test_hugging_face_imagenet_parquet_works_as_downloaded(synset_images: Path, tmp_path: Path) -> None:
    """ImageNet-1k's Hub layout: data/<split>-NNNNN-of-NNNNN.parquet, an image column of bytes and a
    1000-name ClassLabel; training names its classes from it."""
    datasets = pytest.importorskip("datasets")
    from timm.data import ImageNetInfo

    info = ImageNetInfo("imagenet-1k")
    names: list[str] = []
    for i in range(1000):  # "tench, Tinca tinca", as the Hub names them; ClassLabel needs unique names
        name = info.index_to_description(i, detailed=True).split(":")[0]
        names.append(name if name not in names else f"{name} ({info.index_to_label_name(i)})")
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=names)})
    samples = _imagenet_samples(synset_images)
    root = tmp_path / "hub" / "imagenet-1k"  # beside the run's output, not holding it
    (root / "data").mkdir(parents=True)
    for split in ("train", "validation"):
        table = datasets.Dataset.from_dict(
            {
                "image": [{"bytes": p.read_bytes(), "path": p.name} for p, _ in samples],
                "label": [label for _, label in samples],
            },
            features=features,
        )
        table.to_parquet(str(root / "data" / f"{split}-00000-of-00001.parquet"))
    proc = run_script(
        train_args(
            Path("unused"),
            tmp_path,
            "run",
            "--device",
            "cpu",
            "--epochs",
            "1",
            "--batch-size",
            "4",
            "--dataset",
            "hfds/imagenet-1k",
            "--data-dir",
            str(tmp_path / "hub"),
        )
    )
    assert proc.returncode == 0, proc.stderr
    assert "1000 classes" in proc.stdout
    label_names = json.loads((tmp_path / "run" / "model" / "config.json").read_text())["label_names"]
    assert label_names[0] == names[0] and len(label_names) == 1000


# ---------------------------------------------------------------- resume and torchrun on shards


@pytest.mark.cpu_only(reason="signal bookkeeping is host-side; exact npu resume: tests/scripts/test_train.py")
def test_sigterm_mid_epoch_on_shards_resumes_exactly(stores: dict[str, Path], tmp_path: Path) -> None:
    common = [
        "--device",
        "cpu",
        "--epochs",
        "4",
        "--log-interval",
        "1",
        "--resume",
        "auto",
        "--dataset",
        FORMATS["wds"],
        "--data-dir",
        str(stores["wds"]),
    ]
    args = train_args(Path("unused"), tmp_path, "stopped", *common)
    proc = start_script(args)
    for line in proc.stdout:
        if line.startswith("epoch 0:"):
            break
    os.killpg(proc.pid, signal.SIGTERM)
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 143, stderr
    resumed = run_script(args)
    assert resumed.returncode == 0, resumed.stderr
    reference = run_script(train_args(Path("unused"), tmp_path, "reference", *common))
    assert reference.returncode == 0, reference.stderr
    assert_same_weights(
        weights(tmp_path / "reference" / "last.pth.tar"), weights(tmp_path / "stopped" / "last.pth.tar")
    )


@pytest.mark.parametrize("device_type", DEVICE_TYPES)
def test_torchrun_counts_each_shard_sample_once(device_type: str, fashion4: Path, tmp_path: Path) -> None:
    from tests.scripts.test_train import two_devices

    two_devices(device_type)
    odd = tmp_path / "odd"
    proc = _convert(fashion4, odd, "--shard-size", "13")  # 59 after removing one: uneven shards and ranks
    assert proc.returncode == 0, proc.stderr
    info = json.loads((odd / "_info.json").read_text())
    val = info["splits"]["validation"]
    val["shard_lengths"][-1] -= 1  # drop the last sample of the last shard, as a shorter split would
    val["num_samples"] -= 1
    (odd / "_info.json").write_text(json.dumps(info))
    launched = run_script(
        torchrun(
            train_args(
                Path("unused"),
                tmp_path,
                "ddp",
                *device_flags(device_type),
                "--epochs",
                "1",
                "--dataset",
                "wds/odd",
                "--data-dir",
                str(odd),
                "--validation-batch-size",
                "29",
            ),
        ),
        env={"OMP_NUM_THREADS": "1"},
        timeout=300,
    )
    assert launched.returncode == 0, launched.stderr[-3000:]
    assert int(summary(tmp_path / "ddp")[0]["eval_samples"]) == 59


# ---------------------------------------------------------------- bad input: one line, exit 2


def _copy_store(stores: dict[str, Path], kind: str, tmp_path: Path) -> Path:
    import shutil

    return Path(shutil.copytree(stores[kind], tmp_path / kind))


def _validate(flags: list[str], model: Path, *extra: str) -> subprocess.CompletedProcess:
    return run_script(["validate.py", *flags, "--model", str(model), "--device", "cpu", *extra])


@pytest.fixture(scope="module")
def model4(tmp_path_factory: pytest.TempPathFactory, fashion4: Path) -> Path:
    return _model_folder(fashion4, tmp_path_factory.mktemp("model4") / "model")


@pytest.mark.cpu_only(reason="input checks: the run stops with one line before any device work")
def test_missing_shard(stores: dict[str, Path], model4: Path, tmp_path: Path) -> None:
    copy = _copy_store(stores, "wds", tmp_path)
    (copy / "fashion4-validation-000000.tar").unlink()
    assert_usage_error(
        _validate(["--dataset", "wds/x", "--data-dir", str(copy)], model4),
        "1 of 1 shards of split 'validation' are missing",
        "fashion4-validation-000000.tar",
    )


@pytest.mark.parametrize("device_type", DEVICE_TYPES)
def test_truncated_shard_named_or_skipped(
    device_type: str, stores: dict[str, Path], model4: Path, tmp_path: Path
) -> None:
    copy = _copy_store(stores, "wds", tmp_path)
    shard = copy / "fashion4-validation-000000.tar"
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    flags = ["--dataset", "wds/x", "--data-dir", str(copy), *device_flags(device_type)]
    assert_usage_error(_validate(flags, model4), "fashion4-validation-000000.tar")
    results = tmp_path / "skip.json"
    skipped = _validate(
        flags, model4, "--on-bad-image", "skip", "--results-file", str(results), "--results-format", "json"
    )
    assert skipped.returncode == 0, skipped.stderr
    row = json.loads(results.read_text())[0]
    assert row["skipped"] > 0 and row["samples"] + row["skipped"] == 60


@pytest.mark.cpu_only(reason="input checks on the shard's content; the decoding path is device-independent")
def test_sample_without_label_and_undecodable_image(model4: Path, tmp_path: Path) -> None:
    from webdataset import TarWriter

    folder = tmp_path / "custom"
    folder.mkdir()
    png = io.BytesIO()
    Image.new("L", (28, 28), 30).save(png, format="PNG")
    with TarWriter(str(folder / "x-validation-000000.tar")) as writer:
        writer.write({"__key__": "good", "png": png.getvalue(), "cls": b"1"})
        writer.write({"__key__": "nolabel", "png": png.getvalue()})
    assert_usage_error(
        _validate(["--dataset", "wds/x", "--data-dir", str(folder)], model4),
        "x-validation-000000.tar:nolabel",
        "no label",
    )
    with TarWriter(str(folder / "x-validation-000000.tar")) as writer:
        writer.write({"__key__": "garbage", "png": b"not a png", "cls": b"1"})
    assert_usage_error(
        _validate(["--dataset", "wds/x", "--data-dir", str(folder)], model4),
        "x-validation-000000.tar:garbage",
        "cannot read image",
    )


@pytest.mark.cpu_only(reason="input checks: the run stops with one line before any device work")
def test_table_errors(stores: dict[str, Path], model4: Path, tmp_path: Path) -> None:
    """One case as the user meets it (one line, exit 2); the others through the registry, in this process."""
    from vtools.data.readers.registry import SourceRequest, open_source
    from vtools.errors import UsageError

    flags = ["--dataset", "hfds/fashion4", "--data-dir", str(stores["parquet"])]
    assert_usage_error(
        _validate(flags, model4, "--input-key", "img"), "--input-key 'img' is not a column", "image, label"
    )
    cases = [
        (SourceRequest("hfds/fashion4", str(stores["parquet"]), "test"), ["test"]),
        (SourceRequest("hfds/fashion4", str(tmp_path), "validation"), ["no local copy", "--dataset-download"]),
        (
            SourceRequest("hfids/fashion4", str(tmp_path), "validation"),
            ["streaming datasets are not supported", "exact resume"],
        ),
        (SourceRequest("tfds/x", str(tmp_path), "validation"), ["unknown kind"]),
    ]
    for request, fragments in cases:
        with pytest.raises(UsageError) as raised:
            open_source(request)
        for fragment in fragments:
            assert fragment in str(raised.value), (fragment, str(raised.value))
    offline = run_script(
        [
            "validate.py",
            "--dataset",
            "hfds/vtools-test/no-such-set",
            "--data-dir",
            str(tmp_path),
            "--dataset-download",
            "--model",
            str(model4),
            "--device",
            "cpu",
        ],
        env={"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")},
    )
    assert_usage_error(offline, "could not get vtools-test/no-such-set from the Hub")


@pytest.mark.cpu_only(reason="a missing optional package is an import-time matter")
def test_missing_datasets_package_names_the_pip_command(stores: dict[str, Path], model4: Path, tmp_path: Path) -> None:
    shadow = tmp_path / "shadow" / "datasets"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('No module named datasets')\n")
    proc = run_script(
        [
            "validate.py",
            "--dataset",
            "hfds/fashion4",
            "--data-dir",
            str(stores["parquet"]),
            "--model",
            str(model4),
            "--device",
            "cpu",
        ],
        env={"PYTHONPATH": f"{tmp_path / 'shadow'}{os.pathsep}{REPO}"},
    )
    assert_usage_error(proc, "needs the package datasets", "pip install -r requirements-hf.txt")
