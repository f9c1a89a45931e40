"""--class-weights: the weights (scikit-learn's 'balanced', or a file), the loss they reach (torch's weighted
cross-entropy, timm's weighted BCE), the start line, and a whole run on an imbalanced set whose rare class
is recalled better than without them, with the same seed."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from sklearn.utils.class_weight import compute_class_weight
from timm.loss import BinaryCrossEntropy

from tests.cli.test_train_flags import train_flags
from tests.conftest import DEVICE_TYPES, REPO, device_flags, run_script, train_args
from vtools.errors import UsageError
from vtools.train import recipe
from vtools.train.class_weights import (
    balanced_weights,
    class_counts,
    class_weights_for,
    rare_classes_note,
    read_weights_file,
)

HOST_LOGIC = pytest.mark.cpu_only(reason="host arithmetic and file reading; the loss and the runs are on devices")
CLASSES = ["bag", "sneaker", "t-shirt_top", "trouser"]


@HOST_LOGIC
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_balanced_equals_scikit_learns(seed: int) -> None:
    labels = np.random.default_rng(seed).choice(5, size=300, p=[0.6, 0.25, 0.1, 0.04, 0.01])
    expected = compute_class_weight("balanced", classes=np.unique(labels), y=labels)
    ours = balanced_weights(class_counts(labels, 5))
    np.testing.assert_allclose(ours[np.unique(labels)], expected, rtol=1e-12)


@HOST_LOGIC
def test_a_class_without_images_weighs_nothing_and_unlabelled_samples_do_not_count() -> None:
    labels = np.array([0, 0, 0, 2, -1, -1])
    np.testing.assert_array_equal(class_counts(labels, 4), [3, 0, 1, 0])
    np.testing.assert_allclose(balanced_weights(class_counts(labels, 4)), [4 / 6, 0.0, 2.0, 0.0])


@HOST_LOGIC
def test_balanced_needs_labels_known_before_training() -> None:
    with pytest.raises(UsageError, match="--class-weights balanced needs the training labels.*shards streamed"):
        class_weights_for("balanced", None, CLASSES, "shards streamed")


@HOST_LOGIC
def test_weights_files_json_object_list_and_csv(tmp_path: Path) -> None:
    (tmp_path / "named.json").write_text(json.dumps({"trouser": 10, "bag": 0.5}))
    (tmp_path / "listed.json").write_text(json.dumps([1, 2, 3, 4.5]))
    (tmp_path / "rows.csv").write_text("class,weight\ntrouser,10\nbag,0.5\n")
    (tmp_path / "bare.csv").write_text("trouser,10\nbag,0.5\n")
    named = [0.5, 1.0, 1.0, 10.0]  # classes the file leaves out keep 1
    np.testing.assert_array_equal(read_weights_file(str(tmp_path / "named.json"), CLASSES), named)
    np.testing.assert_array_equal(read_weights_file(str(tmp_path / "listed.json"), CLASSES), [1, 2, 3, 4.5])
    np.testing.assert_array_equal(read_weights_file(str(tmp_path / "rows.csv"), CLASSES), named)
    np.testing.assert_array_equal(read_weights_file(str(tmp_path / "bare.csv"), CLASSES), named)


@HOST_LOGIC
@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("count.json", "[1, 2]", "2 weights for 4 classes; give one per class"),
        ("unknown.csv", "coat,2\n", "'coat' not among the 4 classes"),
        ("negative.json", '{"bag": -1}', "the weight of 'bag' is -1; weights are 0 or more"),
        ("word.json", '{"bag": "heavy"}', "the weight of 'bag' is 'heavy', not a number"),
        ("broken.json", "{", "not valid JSON"),
        ("empty.csv", "", "expected class,weight rows"),
        ("twice.csv", "bag,1\nbag,2\n", "'bag' is given twice \\('1' and '2'\\); give it once"),
        ("twice.json", '{"bag": 1, "bag": 2}', "'bag' is given twice \\(1 and 2\\); give it once"),
        ("word.csv", "bag,heavy\n", "the weight of 'bag' is 'heavy', not a number"),
        ("zeros.json", "[0, 0, 0, 0]", "every weight is 0, so the loss would teach nothing"),
        ("zeros.csv", "class,weight\nbag,0\nsneaker,0\ntrouser,0\nt-shirt_top,0\n", "every weight is 0"),
    ],
)
def test_bad_weights_files_are_refused_in_one_line(tmp_path: Path, name: str, content: str, message: str) -> None:
    (tmp_path / name).write_text(content)
    with pytest.raises(UsageError, match=f"--class-weights {tmp_path / name}: .*{message}"):
        read_weights_file(str(tmp_path / name), CLASSES)


@HOST_LOGIC
def test_the_start_line_names_the_rare_classes() -> None:
    note = rare_classes_note(np.array([60, 5, 60, 20, 0]), CLASSES + ["coat"], "class weights (balanced)")
    assert note == (
        "class weights (balanced): rare classes sneaker (5), trouser (20) (largest class: 60 images); "
        "1 class(es) have no training image"
    )
    assert rare_classes_note(np.array([60, 60]), CLASSES[:2], "x") == ""
    assert (
        rare_classes_note(np.array([60, 40]), CLASSES[:2], "x")
        == "x: rare classes sneaker (40) (largest class: 60 images)"
    )


WEIGHTS = torch.tensor([0.5, 1.0, 2.0, 8.0])


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_the_loss_is_torchs_weighted_cross_entropy(device: torch.device, smoothing: float) -> None:
    """The weights reach the number: the loss on a fixed batch equals torch's and differs from the unweighted."""
    torch.manual_seed(0)
    logits, targets = torch.randn(16, 4, device=device), torch.randint(0, 4, (16,), device=device)
    job = train_flags("--smoothing", str(smoothing))
    weighted = recipe.build_train_loss(job.augment, mixup_active=False, class_weights=WEIGHTS).to(device)
    expected = F.cross_entropy(logits, targets, weight=WEIGHTS.to(device), label_smoothing=smoothing)
    torch.testing.assert_close(weighted(logits, targets), expected)
    plain = recipe.build_train_loss(job.augment, mixup_active=False).to(device)
    assert not torch.allclose(plain(logits, targets), expected)


def test_a_batch_of_zero_weight_classes_has_no_loss_and_no_gradient(device: torch.device) -> None:
    """A file may weigh a class 0: a batch of such classes alone would be torch's 0/0; it teaches nothing."""
    weights = torch.tensor([0.0, 0.0, 2.0, 8.0])
    loss = recipe.build_train_loss(train_flags("--smoothing", "0.1").augment, False, class_weights=weights).to(device)
    logits = torch.randn(6, 4, device=device, requires_grad=True)
    nothing = loss(logits, torch.tensor([0, 1, 0, 1, 1, 0], device=device))
    nothing.backward()
    assert nothing.item() == 0.0 and torch.count_nonzero(logits.grad).item() == 0
    mixed = torch.tensor([0, 2, 3, 1, 3, 2], device=device)
    expected = F.cross_entropy(logits, mixed, weight=weights.to(device), label_smoothing=0.1)
    torch.testing.assert_close(loss(logits, mixed), expected)


def test_under_mixup_the_soft_targets_are_weighted(device: torch.device) -> None:
    torch.manual_seed(0)
    logits = torch.randn(16, 4, device=device)
    soft = torch.softmax(torch.randn(16, 4, device=device), dim=1)
    job = train_flags("--mixup", "0.8")
    weighted = recipe.build_train_loss(job.augment, mixup_active=True, class_weights=WEIGHTS).to(device)
    expected = -(soft * WEIGHTS.to(device) * F.log_softmax(logits, dim=1)).sum(1).mean()
    torch.testing.assert_close(weighted(logits, soft), expected)
    torch.testing.assert_close(weighted(logits, soft), F.cross_entropy(logits, soft, weight=WEIGHTS.to(device)))


@pytest.mark.parametrize("mixup", [False, True])
def test_bce_takes_the_weights_as_timms_weight(device: torch.device, mixup: bool) -> None:
    torch.manual_seed(0)
    logits = torch.randn(16, 4, device=device)
    targets = torch.softmax(torch.randn(16, 4), 1).to(device) if mixup else torch.randint(0, 4, (16,), device=device)
    job = train_flags("--bce-loss", "--smoothing", "0.1")
    ours = recipe.build_train_loss(job.augment, mixup_active=mixup, class_weights=WEIGHTS).to(device)
    smoothing = {} if mixup else {"smoothing": 0.1}
    timms = BinaryCrossEntropy(weight=WEIGHTS, **smoothing).to(device)
    torch.testing.assert_close(ours(logits, targets), timms(logits, targets))
    assert not torch.allclose(ours(logits, targets), BinaryCrossEntropy(**smoothing).to(device)(logits, targets))


def imbalanced_set(root: Path, rare: int) -> Path:
    """Four shipped Fashion-MNIST classes, 60 training images each but ``rare`` of trousers; 15 val each."""
    source = REPO / "data/fashion-mnist-mini"
    for split in ("train", "val"):
        for name in CLASSES:
            count = 15 if split == "val" else (rare if name == "trouser" else 60)
            (root / split / name).mkdir(parents=True)
            for file in sorted((source / split / name).glob("*.png"))[:count]:
                shutil.copy(file, root / split / name / file.name)
    return root


def recall_of(run: Path, name: str) -> float:
    with (run / "eval" / "per_class.csv").open(newline="") as handle:
        return next(float(row["recall"]) for row in csv.DictReader(handle) if row["class"] == name)


@pytest.mark.slow
@pytest.mark.parametrize("device_type", DEVICE_TYPES)
def test_balanced_weights_raise_the_rare_class_recall(tmp_path: Path, device_type: str) -> None:
    """6 trousers against 60 of each other class, seed 0, 3 epochs of test_resnet: unweighted, the model
    never predicts a trouser (recall 0 when this test was written); balanced weights recall most of them."""
    data = imbalanced_set(tmp_path / "data", rare=6)
    plain = run_script(train_args(data, tmp_path, "plain", *device_flags(device_type), "--seed", "0"))
    assert plain.returncode == 0, plain.stderr
    weighted = run_script(
        train_args(data, tmp_path, "weighted", *device_flags(device_type), "--seed", "0", "--class-weights", "balanced")
    )
    assert weighted.returncode == 0, weighted.stderr
    assert weighted.stdout.splitlines()[0] == (
        "class weights (balanced): rare classes trouser (6) (largest class: 60 images)"
    )
    assert "rare classes" not in plain.stdout
    assert recall_of(tmp_path / "weighted", "trouser") >= recall_of(tmp_path / "plain", "trouser") + 40.0
