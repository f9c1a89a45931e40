"""timm's validate.py and inference.py flags, checked against timm's own objects (not against vtools).

Each flag's reference is what timm's script does with it: scikit-learn's averaged scores for
--metrics-avg, ``reparameterize_model`` for --reparam, ``resolve_data_config(use_test_size=True)``
for the default input size, ``apply_test_time_pool`` for --test-pool, ``create_transform`` with
``crop_border_pixels``, ``outputs[:, valid_labels]`` for --valid-labels, ``RealLabelsImagenet`` for
--real-labels, ``decay_batch_step`` for --retry and the data frame timm's inference.py builds for
the output-column flags.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import timm
import torch
import torch.nn.functional as F
import torchvision
from timm.data import RealLabelsImagenet, create_transform, resolve_data_config
from timm.layers import apply_test_time_pool
from timm.utils import decay_batch_step
from timm.utils.model import reparameterize_model

from tests.conftest import (
    REPO,
    SYNSETS,
    assert_usage_error,
    device_flags,
    run_script,
    write_image_set,
    write_model_folder,
)
from vtools.cli.runner import command_main
from vtools.cli.timm_compat import no_op_flags, refused_flags
from vtools.commands import infer, validate
from vtools.errors import UsageError
from vtools.evaluation.metrics import ClassCounts

TIMM_OPTIONS = json.loads((REPO / "tests" / "data" / "timm_options.json").read_text())["scripts"]
PARSERS = {"validate.py": validate.build_parser, "inference.py": infer.build_parser}
# the flags this file covers: timm's name, default and dest must be ours too
NEW_FLAGS = {
    "validate.py": "--num-samples --use-train-size --crop-border-pixels --num-gpu --test-pool --no-prefetcher "
    "--pin-mem --tf-preprocessing --reparam --aot-autograd --real-labels --valid-labels --retry --seed "
    "--metrics-avg --naflex-loader --naflex-max-seq-len --gp --fast-norm --model-dtype --torchcompile-mode "
    "--class-map --input-img-mode".split(),
    "inference.py": "--use-train-size --num-gpu --test-pool --aot-autograd --results-separate-col --filename-col "
    "--index-col --label-col --output-col --exclude-output --class-map --gp --model-dtype --torchcompile-mode".split(),
}
REFUSED = {
    "validate.py": [
        ["--num-gpu", "2"],
        ["--aot-autograd"],
        ["--tf-preprocessing"],
        ["--naflex-loader"],
        ["--naflex-max-seq-len", "256"],
    ],
    "inference.py": [["--num-gpu", "2"], ["--aot-autograd"]],
}
NO_OPS = {"validate.py": ["--num-samples", "--no-prefetcher", "--pin-mem"], "inference.py": ["--use-train-size"]}


def _action(parser: argparse.ArgumentParser, flag: str) -> argparse.Action:
    return next(a for a in parser._actions if flag in a.option_strings or (not a.option_strings and a.dest == flag))


# ---------------------------------------------------------------- every option of timm's scripts parses


@pytest.mark.parametrize("script", sorted(PARSERS))
def test_every_timm_option_is_accepted(script: str) -> None:
    parser = PARSERS[script]()
    ours = {flag for action in parser._actions for flag in action.option_strings} | {
        a.dest for a in parser._actions if not a.option_strings
    }
    missing = [o["flags"] for o in TIMM_OPTIONS[script] if not set(o["flags"]) <= ours]
    assert not missing, f"{script} lacks timm's {missing}"
    for option in TIMM_OPTIONS[script]:
        if set(option["flags"]) & set(NEW_FLAGS[script]):
            action = _action(parser, option["flags"][0])
            assert action.dest == option["dest"], option
            assert action.default == option["default"], option


@pytest.mark.parametrize("script", sorted(PARSERS))
def test_refused_and_no_op_flags_are_declared(script: str) -> None:
    parser = PARSERS[script]()
    parser.parse_args(["x"])  # every refused flag at timm's default: the run goes on
    refused = refused_flags(parser)
    assert {args[0] for args in REFUSED[script]} <= set(refused)
    assert set(NO_OPS[script]) <= set(no_op_flags(parser))
    for args in REFUSED[script]:
        with pytest.raises(UsageError, match=re.escape(refused[args[0]])):
            parser.parse_args(["x", *args])
    for flag in NO_OPS[script]:
        action = _action(parser, flag)
        value = [] if action.nargs == 0 else ["7"]
        assert getattr(parser.parse_args(["x", flag, *value]), action.dest) is not None


# as a user meets it, once per script (every refusal's one line is checked in process above)
@pytest.mark.parametrize("script,args", [(s, REFUSED[s][0]) for s in sorted(REFUSED)], ids=str)
@pytest.mark.cpu_only(reason="a refused flag stops the run at parsing, before any device work")
def test_refused_flag_exits_2_with_one_line(script: str, args: list[str], tmp_path: Path) -> None:
    proc = run_script([script, str(tmp_path), "--model", "test_resnet", *args])
    reason = refused_flags(PARSERS[script]())[args[0]]
    assert_usage_error(proc, args[0], reason)


# ---------------------------------------------------------------- --metrics-avg: scikit-learn's numbers


@pytest.mark.parametrize("average", ["micro", "macro", "weighted"])
@pytest.mark.cpu_only(reason="the counts are plain tensor arithmetic; end to end on every device below")
def test_metrics_avg_equal_scikit_learn(average: str) -> None:
    metrics = pytest.importorskip("sklearn.metrics")
    generator = torch.Generator().manual_seed(0)
    counts = ClassCounts(7, torch.device("cpu"))
    predictions, targets = [], []
    for _ in range(3):
        logits = torch.randn(20, 7, generator=generator)
        logits[:, 6] -= 100  # class 6 is never predicted
        target = torch.randint(0, 6, (20,), generator=generator)  # nor a target
        target[target == 5] = 0  # class 5: predicted, never a target
        counts.update(logits, target)
        predictions.append(logits.argmax(1))
        targets.append(target)
    y_pred, y_true = torch.cat(predictions).numpy(), torch.cat(targets).numpy()
    expected = {
        f"{average}_precision": round(
            100 * metrics.precision_score(y_true, y_pred, average=average, zero_division=0), 4
        ),
        f"{average}_recall": round(100 * metrics.recall_score(y_true, y_pred, average=average, zero_division=0), 4),
        f"{average}_f1_score": round(100 * metrics.f1_score(y_true, y_pred, average=average, zero_division=0), 4),
    }
    assert counts.row(average) == pytest.approx(expected, abs=1e-4)


# ---------------------------------------------------------------- validate end to end, against timm


def _run_validate(args: list[str], tmp_path: Path, name: str = "row") -> dict:
    results = tmp_path / f"{name}.json"
    code = command_main("validate")(
        [*args, "--workers", "0", "--results-file", str(results), "--results-format", "json"]
    )
    assert code == 0
    (row,) = json.loads(results.read_text())
    return row


def _timm_reference(
    model: torch.nn.Module, root: Path, config: dict, label_of=None, outputs=None, **transform
) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """(logits, targets, file names) by timm and torchvision alone, all images in one batch."""
    dataset = torchvision.datasets.ImageFolder(str(root), transform=create_transform(**config, **transform))
    images = torch.stack([image for image, _ in dataset])
    targets = torch.tensor([label_of[dataset.classes[t]] if label_of else t for _, t in dataset])
    with torch.no_grad():
        logits = model.eval()(images)
    if outputs is not None:
        logits = logits[:, outputs]
    return logits, targets, [Path(path).name for path, _ in dataset.samples]


def _top1_loss(logits: torch.Tensor, targets: torch.Tensor) -> tuple[float, float]:
    return 100 * (logits.argmax(1) == targets).float().mean().item(), F.cross_entropy(logits, targets).item()


def test_metrics_avg_end_to_end(device: torch.device, custom_images: Path, custom_model_dir: Path, tmp_path) -> None:
    metrics = pytest.importorskip("sklearn.metrics")
    row = _run_validate(
        [str(custom_images), *device_flags(str(device)), "--model", str(custom_model_dir), "--metrics-avg", "macro"],
        tmp_path,
    )
    model = timm.create_model(f"local-dir:{custom_model_dir}", pretrained=True)
    logits, targets, _ = _timm_reference(model, custom_images, resolve_data_config(model=model, use_test_size=True))
    y_true, y_pred = targets.numpy(), logits.argmax(1).numpy()
    assert row["macro_f1_score"] == pytest.approx(
        round(100 * metrics.f1_score(y_true, y_pred, average="macro", zero_division=0), 4), abs=1e-3
    )
    assert row["macro_precision"] == pytest.approx(
        round(100 * metrics.precision_score(y_true, y_pred, average="macro", zero_division=0), 4), abs=1e-3
    )
    assert list(row)[5:8] == ["macro_precision", "macro_recall", "macro_f1_score"]  # after top5_err, as timm


@pytest.mark.cpu_only(reason="fusing branches is a host-side model transform; the fused model runs like any other")
def test_reparam_is_timms(custom_images: Path, custom_classes: list[str], tmp_path: Path) -> None:
    folder = write_model_folder(tmp_path / "mobileone", 3, custom_classes, model_name="mobileone_s0")
    args = [str(custom_images), "--device", "cpu", "--model", str(folder), "--img-size", "64"]
    plain, fused = _run_validate(args, tmp_path, "plain"), _run_validate([*args, "--reparam"], tmp_path, "fused")
    model = reparameterize_model(timm.create_model(f"local-dir:{folder}", pretrained=True))
    assert fused["param_count"] == round(sum(p.numel() for p in model.parameters()) / 1e6, 2)
    assert fused["param_count"] < plain["param_count"]
    config = resolve_data_config({"img_size": 64}, model=model, use_test_size=True)
    label_of = {name: i for i, name in enumerate(custom_classes)}
    top1, loss = _top1_loss(*_timm_reference(model, custom_images, config, label_of)[:2])
    assert fused["top1"] == pytest.approx(top1, abs=1e-3)
    # random weights give a loss near 1e14: float32 rounding of the normalization (timm's prefetcher form
    # here, ToTensor + Normalize in the reference) shows in its eighth digit
    assert fused["loss"] == pytest.approx(loss, rel=1e-5, abs=1e-4)


@pytest.mark.cpu_only(reason="the data config is resolved on the host")
def test_default_size_is_the_test_size_as_timm(custom_images: Path, tmp_path: Path) -> None:
    """resnet18.a1_in1k's pretrained config has test_input_size 288 (train 224); random weights, no download."""
    model = timm.create_model("resnet18.a1_in1k", pretrained=False, num_classes=3)
    checkpoint = tmp_path / "weights.pth"
    torch.save(model.state_dict(), checkpoint)
    args = [str(custom_images), "--device", "cpu", "--model", "resnet18.a1_in1k", "--checkpoint", str(checkpoint)]
    args += ["--num-classes", "3", "--class-map", str(_class_map(tmp_path, ["cat", "dog", "fox"]))]
    test_size = resolve_data_config(model=model, use_test_size=True)
    train_size = resolve_data_config(model=model, use_test_size=False)
    assert test_size["input_size"] != train_size["input_size"]
    row = _run_validate(args, tmp_path, "test")
    assert (row["img_size"], row["crop_pct"]) == (test_size["input_size"][-1], test_size["crop_pct"])
    row = _run_validate([*args, "--use-train-size"], tmp_path, "train")
    assert (row["img_size"], row["crop_pct"]) == (train_size["input_size"][-1], train_size["crop_pct"])


def _class_map(tmp_path: Path, names: list[str]) -> Path:
    path = tmp_path / "class_map.txt"
    path.write_text("\n".join(names) + "\n")
    return path


def test_test_pool_and_crop_border_are_timms(
    device: torch.device, custom_images: Path, custom_model_dir: Path, custom_classes: list[str], tmp_path: Path
) -> None:
    """An input larger than the pretrained 160: timm's TestTimePoolHead, crop 1.0; border pixels cut first."""
    row = _run_validate(
        [str(custom_images), *device_flags(str(device)), "--model", str(custom_model_dir)]
        + ["--img-size", "192", "--test-pool", "--crop-border-pixels", "15"],
        tmp_path,
    )
    model = timm.create_model(f"local-dir:{custom_model_dir}", pretrained=True)
    config = resolve_data_config({"img_size": 192}, model=model, use_test_size=True)
    model, pooled = apply_test_time_pool(model, config)
    assert pooled and row["crop_pct"] == 1.0
    config["crop_pct"] = 1.0
    label_of = {name: i for i, name in enumerate(custom_classes)}
    top1, loss = _top1_loss(*_timm_reference(model, custom_images, config, label_of, crop_border_pixels=15)[:2])
    assert row["top1"] == pytest.approx(top1, abs=1e-3)
    assert row["loss"] == pytest.approx(loss, abs=1e-4)


def test_valid_labels_score_a_subset_of_outputs(
    device: torch.device, synset_images: Path, imagenet_model_dir: Path, tmp_path: Path
) -> None:
    """An ImageNet-A/R-style set: its synset folders in sorted order are labels 0..k-1 of the outputs the
    --valid-labels file lists (timm: ``output[:, valid_labels]``)."""
    info = timm.data.ImageNetInfo()
    valid = sorted(info.label_names().index(name) for name in SYNSETS)
    valid_file = tmp_path / "valid.txt"
    valid_file.write_text("".join(f"{i}\n" for i in valid))
    row = _run_validate(
        [str(synset_images), *device_flags(str(device)), "--model", str(imagenet_model_dir)]
        + ["--valid-labels", str(valid_file)],
        tmp_path,
    )
    model = timm.create_model(f"local-dir:{imagenet_model_dir}", pretrained=True)
    config = resolve_data_config(model=model, use_test_size=True)
    top1, loss = _top1_loss(*_timm_reference(model, synset_images, config, outputs=valid)[:2])
    assert row["top1"] == pytest.approx(top1, abs=1e-3)
    assert row["loss"] == pytest.approx(loss, abs=1e-4)


@pytest.mark.cpu_only(reason="the ReaL bookkeeping is host-side (timm's RealLabelsImagenet)")
def test_real_labels_are_timms(custom_model_dir: Path, custom_classes: list[str], tmp_path: Path) -> None:
    root = write_image_set(tmp_path / "val", custom_classes, per_class=3, seed=4)
    files = sorted(root.rglob("*.*"))
    for number, file in enumerate(files, start=1):  # ILSVRC2012 names (decoded by content), in path order
        file.rename(file.with_name(f"ILSVRC2012_val_{number:08d}.JPEG"))
    real = [[], [0, 1], [2], [1], [0], [0, 2], [1], [2], [], [0], [1, 2], [2]][: len(files)]
    real_json = tmp_path / "real.json"
    real_json.write_text(json.dumps(real))
    row = _run_validate(
        [str(root), "--device", "cpu", "--model", str(custom_model_dir), "--real-labels", str(real_json)], tmp_path
    )
    model = timm.create_model(f"local-dir:{custom_model_dir}", pretrained=True)
    logits, _, names = _timm_reference(model, root, resolve_data_config(model=model, use_test_size=True))
    reference = RealLabelsImagenet(names, real_json=str(real_json), topk=(1, 2))  # top-5 of 3 outputs: top-2 here
    reference.add_result(logits)
    assert row["top1"] == pytest.approx(round(reference.get_accuracy(1), 4), abs=1e-3)
    top3 = [any(i in real[int(n[15:23]) - 1] for i in range(3)) for n in names if real[int(n[15:23]) - 1]]
    assert row["top5"] == pytest.approx(100 * sum(top3) / len(top3), abs=1e-3)  # every label is in the top 3


@pytest.mark.cpu_only(reason="the retry loop is host-side; the out-of-memory error is simulated")
def test_retry_decays_the_batch_like_timm(
    monkeypatch: pytest.MonkeyPatch, custom_images: Path, custom_model_dir: Path, tmp_path: Path
) -> None:
    tried: list[int] = []
    real_validate_one = validate.validate_one

    def validate_one(args, options, model_name, checkpoint, runtime, report_dir=None):
        tried.append(options.evaluation.batch_size)
        if options.evaluation.batch_size > 4:
            raise torch.OutOfMemoryError("out of memory: tried to allocate 2.00 GiB")
        return real_validate_one(args, options, model_name, checkpoint, runtime, report_dir)

    monkeypatch.setattr(validate, "validate_one", validate_one)
    args = [str(custom_images), "--device", "cpu", "--model", str(custom_model_dir), "--batch-size", "16"]
    row = _run_validate([*args, "--retry"], tmp_path)
    expected = [16]
    while expected[-1] > 4:
        expected.append(decay_batch_step(expected[-1]))
    assert tried == expected == [16, 12, 8, 6, 4]
    assert row["samples"] == 12
    tried.clear()
    with pytest.raises(torch.OutOfMemoryError):
        _run_validate(args, tmp_path)  # without --retry: the error stands
    assert tried == [16]


@pytest.mark.cpu_only(reason="seeding is host-side")
def test_seed_is_timms(custom_images: Path, custom_model_dir: Path, tmp_path: Path) -> None:
    _run_validate([str(custom_images), "--device", "cpu", "--model", str(custom_model_dir), "--seed", "7"], tmp_path)
    assert torch.initial_seed() == 7  # timm.utils.random_seed(seed) seeds torch, numpy and random


@pytest.mark.cpu_only(reason="images are decoded on the host")
def test_input_img_mode_is_honoured(custom_images: Path, tmp_path: Path) -> None:
    """Two-band LA images for a 2-channel model: the mode timm's --input-img-mode converts images to."""
    torch.manual_seed(0)
    model = timm.create_model("test_resnet", num_classes=3, in_chans=2)
    torch.save(model.state_dict(), tmp_path / "la.pth")
    args = [str(custom_images), "--device", "cpu", "--model", "test_resnet", "--checkpoint", str(tmp_path / "la.pth")]
    args += ["--num-classes", "3", "--in-chans", "2", "--mean", "0.5", "0.4", "--std", "0.25", "0.2"]
    with pytest.raises(UsageError, match=r"read in PIL mode RGB \(3 channels\) but the model takes 2"):
        _run_validate(args, tmp_path)  # RGB by default: 3 channels
    row = _run_validate([*args, "--input-img-mode", "LA"], tmp_path)
    overrides = {"in_chans": 2, "mean": (0.5, 0.4), "std": (0.25, 0.2)}
    config = resolve_data_config(overrides, model=model, use_test_size=True)
    dataset = torchvision.datasets.ImageFolder(
        str(custom_images), transform=create_transform(**config), loader=lambda p: _pil(p).convert("LA")
    )
    images, targets = torch.stack([i for i, _ in dataset]), torch.tensor([t for _, t in dataset])
    with torch.no_grad():
        top1, loss = _top1_loss(model.eval()(images), targets)
    assert row["loss"] == pytest.approx(loss, abs=1e-4) and row["top1"] == pytest.approx(top1, abs=1e-3)


def _pil(path: str):
    from PIL import Image

    with Image.open(path) as image:
        return image.copy()


# ---------------------------------------------------------------- inference columns: timm's data frame


def timm_frame(
    names: list[str], scores: np.ndarray, indices: np.ndarray | None, labels: list[str] | None, args: SimpleNamespace
) -> pd.DataFrame:
    """The frame timm's inference.py builds from its top-k (or full) outputs, written from its logic:
    indices only with --include-index, labels when there are any, ``<col>_<i>`` columns with
    --results-separate-col when there is more than one value per image, else a (squeezed) list per column."""
    output_col = args.output_col or args.output_type
    all_indices = indices if (indices is not None and args.include_index) else None
    all_labels = np.vectorize(lambda i: labels[i], otypes=[object])(indices) if labels and indices is not None else None
    data = {args.filename_col: names}
    if args.results_separate_col and scores.shape[-1] > 1:
        if all_indices is not None:
            for i in range(all_indices.shape[-1]):
                data[f"{args.index_col}_{i}"] = all_indices[:, i]
        if all_labels is not None:
            for i in range(all_labels.shape[-1]):
                data[f"{args.label_col}_{i}"] = all_labels[:, i]
        if not args.exclude_output:
            for i in range(scores.shape[-1]):
                data[f"{output_col}_{i}"] = scores[:, i]
    else:
        if all_indices is not None:
            data[args.index_col] = list(all_indices.squeeze(-1) if all_indices.shape[-1] == 1 else all_indices)
        if all_labels is not None:
            data[args.label_col] = list(all_labels.squeeze(-1) if all_labels.shape[-1] == 1 else all_labels)
        if not args.exclude_output:
            data[output_col] = list(scores.squeeze(-1) if scores.shape[-1] == 1 else scores)
    return pd.DataFrame(data)


COLUMN_CASES = {
    "top1": [],
    "top3-lists": ["--topk", "3", "--include-index"],
    "top3-separate": ["--topk", "3", "--include-index", "--results-separate-col"],
    "top1-separate-is-scalar": ["--topk", "1", "--include-index", "--results-separate-col"],
    "renamed": ["--topk", "2", "--include-index", "--filename-col", "f", "--index-col", "i", "--label-col", "l"]
    + ["--output-col", "score"],
    "renamed-separate": ["--topk", "2", "--include-index", "--results-separate-col", "--index-col", "i"]
    + ["--output-col", "score", "--output-type", "logit"],
    "exclude-output": ["--topk", "2", "--include-index", "--exclude-output"],
    "all-classes-separate": ["--topk", "0", "--results-separate-col"],
}


@pytest.mark.parametrize("flags", COLUMN_CASES.values(), ids=COLUMN_CASES.keys())
@pytest.mark.cpu_only(reason="result columns are built on the host from fixed predictions")
def test_inference_columns_are_timms(flags: list[str]) -> None:
    args = infer.build_parser().parse_args(["x", *flags])
    generator = torch.Generator().manual_seed(1)
    scores = torch.randn(5, 4, generator=generator).softmax(1)
    labels = ["cat", "dog", "fox", "owl"]
    if args.topk:
        top = scores.topk(args.topk, dim=1)
        outputs, values, indices = [(torch.arange(5), top.values, top.indices)], top.values, top.indices.numpy()
    else:
        outputs, values, indices = [(torch.arange(5), scores, None)], scores, None
    names = [f"img{i}.jpg" for i in range(5)]
    rows = infer.make_rows(args, lambda i: f"/data/{names[i]}", outputs, labels)
    ours = pd.DataFrame(rows)
    expected = timm_frame(names, values.numpy(), indices, labels, args)
    assert list(ours.columns) == list(expected.columns)
    for column in expected.columns:
        for got, want in zip(ours[column], expected[column]):
            want = np.asarray(want).tolist()
            if isinstance(want, str) or (isinstance(want, list) and isinstance(want[0], str)):
                assert got == want
            else:
                assert np.asarray(got, dtype=float) == pytest.approx(np.asarray(want, dtype=float), abs=1e-6)


@pytest.mark.cpu_only(reason="which files are read is decided on the host")
def test_inference_class_map_selects_class_folders(
    custom_images: Path, custom_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """timm's folder reader keeps only the images whose folder is named in --class-map."""
    monkeypatch.chdir(tmp_path)
    code = command_main("infer")(
        [str(custom_images), "--device", "cpu", "--workers", "0", "--model", str(custom_model_dir)]
        + ["--class-map", str(_class_map(tmp_path, ["fox", "cat"])), "--results-file", "out", "--topk", "2"]
        + ["--filename-col", "name", "--results-separate-col", "--no-console-results"]
    )
    assert code == 0
    frame = pd.read_csv(tmp_path / "out.csv")
    expected = sorted(p.name for folder in ("cat", "fox") for p in (custom_images / folder).iterdir())
    assert sorted(frame["name"]) == expected
    assert list(frame.columns) == ["name", "label_0", "label_1", "prob_0", "prob_1"]


@pytest.mark.cpu_only(reason="an argument check before any device work")
def test_exclude_output_needs_topk() -> None:
    with pytest.raises(UsageError, match="--exclude-output"):
        command_main("infer")(["x", "--model", "m", "--device", "cpu", "--topk", "0", "--exclude-output"])
