"""The benchmark runs and writes a table pandas reads (its figures are measured, never asserted)."""

from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path

import pandas as pd
import pytest
import torch

from benchmarks.command import build_parser
from benchmarks.measure import measure
from benchmarks.options import BenchOptions
from tests.conftest import REPO, device_flags, run_script
from vtools.cli.typed import typed_options


def _options(argv: list[str]) -> BenchOptions:
    """The bench's options for ``argv``, built as its command builds them."""
    return typed_options(BenchOptions, build_parser().parse_args(argv))


@pytest.mark.cpu_only(
    reason="checks the report's rows and columns; the measured loops are the ones the npu tests "
    "run, and the data sources' device parity is in tests/scripts/test_sources.py"
)
def test_benchmark_report(tmp_path: Path) -> None:
    """One run: model/vtools/baseline modes, vtools on folder, shards and parquet, the decode task on
    pre-resized shards, the loader ceiling on photos, and whole train.py runs against the plain loop
    (recipe, onepass with the model alone); every figure positive, ratios where they apply, a table pandas
    reads."""
    pytest.importorskip("datasets")
    out = tmp_path / "bench.csv"
    proc = run_script(
        [
            "-m",
            "benchmarks",
            "--model",
            "test_resnet",
            "--tasks",
            "validate",
            "recipe",
            "decode",
            "onepass",
            "loader",
            "--photos",
            "4",
            "--sources",
            "folder",
            "wds",
            "parquet",
            "--max-side",
            "16",
            "--recipe-epochs",
            "1",
            "--recipe-precisions",
            "float32",
            "--device",
            "cpu",
            "--steps",
            "1",
            "--warmup",
            "1",
            "--batch-size",
            "4",
            "--workers",
            "0",
            "--output",
            str(out),
        ]
    )
    assert proc.returncode == 0, proc.stderr
    table = pd.read_csv(out)
    rows = list(zip(table["task"], table["mode"], table["source"]))
    assert rows == [
        ("validate", "model", "folder"),
        ("validate", "vtools", "folder"),
        ("validate", "vtools", "wds"),
        ("validate", "vtools", "parquet"),
        ("validate", "baseline", "folder"),
        ("decode", "vtools", "folder"),
        ("decode", "vtools", "wds-max16"),
        ("loader-train", "vtools", "folder"),
        ("loader-train", "baseline", "folder"),
        ("loader-val", "vtools", "folder"),
        ("loader-val", "baseline", "folder"),
        ("host-train", "vtools", "folder"),
        ("host-train", "baseline", "folder"),
        ("recipe", "vtools", "folder"),
        ("recipe", "baseline", "folder"),
        ("onepass", "model", "folder"),
        ("onepass", "vtools", "folder"),
        ("onepass", "baseline", "folder"),
    ]
    whole = table[table["task"] == "onepass"]
    assert (whole["wall_s"] > 0).all() and whole.loc[whole["mode"] != "model", "top1"].between(0, 100).all()
    assert whole.loc[whole["mode"] == "vtools", ["vs_model", "wall_vs_baseline"]].notna().all().all()
    ceiling = table[table["task"].isin(["loader-train", "loader-val", "host-train"])]
    assert (ceiling["img_per_sec_per_core"] > 0).all()
    assert ceiling.loc[ceiling["mode"] == "vtools", "vs_baseline"].notna().all()
    recipe = table[table["task"] == "recipe"]
    assert (recipe["wall_s"] > 0).all() and recipe["top1"].between(0, 100).all()
    assert recipe.loc[recipe["mode"] == "vtools", "wall_vs_baseline"].notna().all()
    for column in ("img_per_sec", "data_wait", "startup_s", "peak_host_mib", "vs_model", "vs_baseline"):
        assert column in table.columns
    assert (table["img_per_sec"] > 0).all()
    assert (table.loc[table["task"].isin(["validate", "decode"]), "startup_s"] > 0).all()
    validate = table[table["task"] == "validate"]
    assert validate["data_wait"].between(0, 1).all()
    assert validate.loc[validate["mode"] == "vtools", ["vs_model", "vs_baseline"]].notna().all().all()


@pytest.mark.parametrize(
    "task, module, loop",
    [
        ("train", "vtools.train.loop", "train_one_epoch"),
        ("validate", "vtools.evaluation.loops", "evaluate"),
        ("inference", "vtools.evaluation.loops", "predict"),
    ],
)
@pytest.mark.parametrize("mode", ["vtools", "model"])
def test_bench_measures_the_real_loops(
    device: torch.device, task: str, module: str, loop: str, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each figure comes from the function the scripts run (train.py's train_one_epoch with its own
    loaders and components, validate.py's evaluate, inference.py's predict), fed every timed batch."""
    real = getattr(importlib.import_module(module), loop)
    seen: list[int] = []

    def spy(*args: object, **kwargs: object) -> object:
        batches = args[1]
        counted = Counting(batches)
        result = real(args[0], counted, *args[2:], **kwargs)
        if loop == "predict":  # a generator: the batches are taken as it is consumed
            result = list(result)
        seen.append(counted.count)
        return result

    monkeypatch.setattr(f"{module}.{loop}", spy)
    threads = torch.get_num_threads()
    argv = [
        "--model",
        "test_resnet",
        "--data",
        str(REPO / "data/fashion-mnist-mini"),
        "--steps",
        "2",
        "--warmup",
        "1",
        "--batch-size",
        "4",
        "--workers",
        "0",
        *device_flags(device.type),
    ]
    try:
        row = measure(task, mode, "folder", _options(argv))
    finally:
        torch.set_num_threads(threads)
    assert seen == [3], f"{loop} consumed {seen} batches, expected 3 (1 warm-up + 2 timed)"
    assert row["img_per_sec"] > 0 and row["device"].startswith(device.type)


class Counting:
    """An iterable that counts what the loop took from it (and keeps its length)."""

    def __init__(self, batches: object) -> None:
        self.batches, self.count = batches, 0

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> object:
        for batch in self.batches:
            self.count += 1
            yield batch


@pytest.mark.parametrize("split", ["train", "val"])
def test_loader_ceiling_measures_train_pys_loader_and_timms(
    device: torch.device, split: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loader task feeds train.py's own training loader (the fused augmentation, decoding from the
    file) or its validation loader, and timm's create_loader, every timed batch; on ImageNet-sized JPEGs
    cut from the shipped photos."""
    import timm.data

    from benchmarks.loader_ceiling import measure_loader
    from benchmarks.photos import make_photo_set
    from vtools.data import train_augment, transforms

    if importlib.util.find_spec("sklearn") is None and importlib.util.find_spec("matplotlib") is None:
        pytest.skip("needs scikit-learn or matplotlib: the photos are cut from their wheels")
    assert make_photo_set(tmp_path, 8, classes=2)
    calls = {"fused": 0, "eval": 0, "timm": 0}

    def counting(name: str, real: object) -> object:
        def wrapper(*args: object, **kwargs: object) -> object:
            calls[name] += 1
            return real(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(
        train_augment.FusedTrainAugment,
        "from_source",
        counting("fused", train_augment.FusedTrainAugment.from_source),
    )
    real_eval = transforms.eval_transform
    monkeypatch.setattr("vtools.train.assemble.eval_transform", lambda *a, **k: counting("eval", real_eval(*a, **k)))
    monkeypatch.setattr("timm.data.create_loader", counting("timm", timm.data.create_loader))
    argv = ["--data", str(tmp_path), "--steps", "2", "--warmup", "1", "--batch-size", "2", "--workers", "0"]
    options = _options([*argv, "--model", "test_resnet", *device_flags(device.type)])
    threads = torch.get_num_threads()
    try:
        ours = measure_loader("vtools", split, options)
        theirs = measure_loader("baseline", split, options)
    finally:
        torch.set_num_threads(threads)
    images = 3 * 2  # 1 warm-up + 2 timed batches of 2; a device with streams prepares one batch ahead
    counted = calls["fused"] if split == "train" else calls["eval"]
    assert counted in (images, images + 2) and calls["timm"] == 1, calls
    assert calls["eval" if split == "train" else "fused"] == 0, calls
    for row in (ours, theirs):
        assert row["task"] == f"loader-{split}" and row["img_per_sec_per_core"] > 0
        assert 0 <= row["data_wait"] <= 1


def test_onepass_model_alone_runs_the_epochs_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """The model-alone figure of the onepass task runs train_one_epoch for the folder's step count (after
    a short probe of both layouts) and evaluate for its validation batches, and both whole runs get the
    same flags, which timm's own train.py parses."""
    import vtools.evaluation.loops
    import vtools.train.loop
    from benchmarks import onepass
    from tests.timm_reference import timm_parser

    seen: dict[str, list[int]] = {"train": [], "eval": []}

    def spy(name: str, real: object) -> object:
        def wrapper(model_or_parts: object, batches: object, *args: object, **kwargs: object) -> object:
            counted = Counting(batches)
            result = real(model_or_parts, counted, *args, **kwargs)
            seen[name].append(counted.count)
            return result

        return wrapper

    monkeypatch.setattr(vtools.train.loop, "train_one_epoch", spy("train", vtools.train.loop.train_one_epoch))
    monkeypatch.setattr(vtools.evaluation.loops, "evaluate", spy("eval", vtools.evaluation.loops.evaluate))
    data = str(REPO / "data/fashion-mnist-mini")
    options = _options(["--model", "test_resnet", "--data", data, "--device", "cpu", "--workers", "0"])
    threads = torch.get_num_threads()
    try:
        row = onepass.measure_model_epoch(options)
    finally:
        torch.set_num_threads(threads)
    train_images, val_images = onepass.split_counts(data)
    assert seen == {"train": [onepass.PROBE_STEPS] * 2 + [train_images // 128], "eval": [-(-val_images // 128)]}
    assert row["wall_s"] > 0 and isinstance(row["channels_last"], bool)
    commands = onepass.run_commands(dataclasses.replace(options, timm_train="timm/train.py"), "out")
    ours, timms = commands["vtools"], commands["baseline"]
    assert ours[ours.index("--img-size") :] == timms[timms.index("--img-size") :]
    parsed = timm_parser("train.py").parse_args(timms[timms.index("--data-dir") :])
    assert (parsed.img_size, parsed.epochs, parsed.color_jitter, parsed.train_interpolation) == (32, 1, 0.4, "random")
