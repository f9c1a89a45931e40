"""The class report (validate.py --report, a run's eval/) against scikit-learn, on every device.

Predictions are collected on the device by ``PredictionLog`` batch by batch, as validation does, and every
figure of the report is compared with scikit-learn's function for it on the same logits: per-class
precision/recall/F1/support, the macro and weighted averages (timm's --metrics-avg figures), the confusion
matrix, top-1/top-5 (per class too), the calibration bins; the ECE with its textbook definition.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.calibration import calibration_curve
from sklearn.metrics import confusion_matrix, precision_recall_fscore_support, top_k_accuracy_score

from vtools.evaluation.class_report import DENSE_CONFUSION_MAX, build_report
from vtools.evaluation.metrics import ClassCounts
from vtools.evaluation.predictions import PredictionLog
from vtools.evaluation.report_files import (
    CONFUSION,
    CONFUSION_CELLS,
    read_confusion,
    report_file_names,
    write_report,
)

NUM_CLASSES = 12
SAMPLES = 500


def logits_and_targets(seed: int = 0, num_classes: int = NUM_CLASSES, samples: int = SAMPLES):
    """Logits that are right about half the time; class 10 is never predicted and the last class is neither
    a label nor a prediction, so zero divisions happen and averages must leave that class out; some labels
    sit exactly at rank 5 and 6 (the top-5 boundary)."""
    generator = torch.Generator().manual_seed(seed)
    targets = torch.randint(0, num_classes - 1, (samples,), generator=generator)
    logits = torch.randn(samples, num_classes, generator=generator)
    lucky = torch.rand(samples, generator=generator) < 0.5
    logits[lucky, targets[lucky]] += 3.0
    logits[:, 10] -= 20.0  # never the argmax
    logits[:, num_classes - 1] -= 20.0  # never the argmax, and never a label
    for row, rank in ((0, 4), (1, 5), (2, 5), (3, 6)):  # 0-based: the label ranked 5th, 6th, 6th, 7th
        order = logits[row].argsort(descending=True)
        order = order[order != targets[row]]
        logits[row, targets[row]] = (logits[row, order[rank - 1]] + logits[row, order[rank]]) / 2
    return logits, targets


def collect(logits: torch.Tensor, targets: torch.Tensor, device: torch.device, batch: int = 64):
    log = PredictionLog()
    for start in range(0, len(targets), batch):
        chunk = slice(start, start + batch)
        log.add(logits[chunk].to(device), targets[chunk].to(device), torch.arange(len(targets))[chunk])
    return log.gather(device)


def test_report_equals_scikit_learn(device: torch.device) -> None:
    logits, targets = logits_and_targets()
    report = build_report(collect(logits, targets, device), [f"c{i}" for i in range(NUM_CLASSES)])
    y_true, scores = targets.numpy(), logits.numpy()
    y_pred = scores.argmax(axis=1)
    labels = list(range(NUM_CLASSES))

    precision, recall, f1, support = precision_recall_fscore_support(y_true, y_pred, labels=labels, zero_division=0)
    rows = report.per_class
    assert [r["support"] for r in rows] == support.tolist()
    assert [r["predicted"] for r in rows] == np.bincount(y_pred, minlength=NUM_CLASSES).tolist()
    for key, reference in (("precision", precision), ("recall", recall), ("f1", f1), ("top1", recall)):
        np.testing.assert_allclose([r[key] for r in rows], 100 * reference, atol=1e-4, err_msg=key)
    for index, row in enumerate(rows):
        mine = y_true == index
        if mine.any():
            top5 = top_k_accuracy_score(y_true[mine], scores[mine], k=5, labels=labels)
            assert row["top5"] == pytest.approx(100 * top5, abs=1e-4), index

    np.testing.assert_array_equal(report.confusion.dense(), confusion_matrix(y_true, y_pred, labels=labels))
    kept = [7, 2, 5]  # some classes, in another order: the rows and columns of exactly those
    np.testing.assert_array_equal(
        report.confusion.dense(kept), confusion_matrix(y_true, y_pred, labels=labels)[kept][:, kept]
    )
    counts = ClassCounts(NUM_CLASSES, device)  # the --metrics-avg path timm's figures come from, batch by batch
    for chunk in range(0, SAMPLES, 64):
        counts.update(logits[chunk : chunk + 64].to(device), targets[chunk : chunk + 64].to(device))
    for average in ("macro", "weighted"):
        reference = precision_recall_fscore_support(y_true, y_pred, average=average, zero_division=0)[:3]
        got = [report.overall[f"{average}_{key}"] for key in ("precision", "recall", "f1_score")]
        np.testing.assert_allclose(got, 100 * np.array(reference), atol=1e-4, err_msg=average)
        assert got == list(counts.row(average).values())
    micro = precision_recall_fscore_support(y_true, y_pred, average="micro", zero_division=0)[:3]
    np.testing.assert_allclose(list(counts.row("micro").values()), 100 * np.array(micro), atol=1e-4)
    with pytest.raises(ValueError, match="unknown average 'median': use one of micro, macro, weighted"):
        counts.row("median")
    assert report.overall["top1"] == pytest.approx(100 * (y_pred == y_true).mean(), abs=1e-4)
    assert report.overall["top5"] == pytest.approx(
        100 * top_k_accuracy_score(y_true, scores, k=5, labels=labels), abs=1e-4
    )


@pytest.mark.cpu_only(reason="count tables on the host")
@pytest.mark.parametrize(
    "y_true, y_pred",
    [
        ([0, 1, 1, 3], [0, 1, 2, 2]),  # class 3 labelled once, never predicted; class 2 predicted, never labelled
        ([1], [1]),  # one sample: the weights sum to 1
        ([2], [0]),
        ([0, 0, 0, 4], [0, 4, 4, 1]),  # one prediction of class 1: a denominator of 1
    ],
)
def test_averages_equal_scikit_learn_on_small_tables(y_true: list[int], y_pred: list[int]) -> None:
    """The averages over the classes that occur, where one sample or one prediction decides: scikit-learn's
    figures with ``zero_division=0`` (classes 0-5, some never seen, are in the count table)."""
    from vtools.evaluation.metrics import averaged_scores

    y, p = np.array(y_true), np.array(y_pred)
    hits = np.bincount(y[y == p], minlength=6)
    predicted, true = np.bincount(p, minlength=6), np.bincount(y, minlength=6)
    for average in ("micro", "macro", "weighted"):
        reference = precision_recall_fscore_support(y, p, average=average, zero_division=0)[:3]
        np.testing.assert_allclose(averaged_scores(hits, predicted, true, average), reference, err_msg=average)
    nothing = np.zeros(6, dtype=np.int64)
    for average in ("micro", "macro", "weighted"):
        assert averaged_scores(nothing, nothing, nothing, average) == (0.0, 0.0, 0.0)


def test_top5_at_the_boundary(device: torch.device) -> None:
    """Labels ranked exactly 5th count for top-5, 6th do not (a top-k off by one shows here)."""
    logits, targets = logits_and_targets()
    predictions = collect(logits, targets, device)
    assert predictions.target_rank[:4].tolist() == [4, 5, 5, 6]
    report = build_report(predictions, [f"c{i}" for i in range(NUM_CLASSES)])
    k5 = top_k_accuracy_score(targets[:4].numpy(), logits[:4].numpy(), k=5, labels=list(range(NUM_CLASSES)))
    assert k5 == 0.25
    first = build_report(collect(logits[:4], targets[:4], device), report.classes)
    assert first.overall["top5"] == 25.0


def test_calibration_bins_and_ece_equal_their_definitions(device: torch.device) -> None:
    logits, targets = logits_and_targets(seed=1)
    predictions = collect(logits, targets, device)
    report = build_report(predictions, [f"c{i}" for i in range(NUM_CLASSES)], bins=10)
    probs = logits.softmax(dim=1).numpy().astype(np.float64)
    confidence, correct = probs.max(axis=1), probs.argmax(axis=1) == targets.numpy()
    np.testing.assert_allclose(predictions.confidence, confidence, rtol=1e-6)
    accuracy, mean_confidence = calibration_curve(correct, confidence, n_bins=10, strategy="uniform")
    filled = [row for row in report.calibration if row["count"]]
    np.testing.assert_allclose([r["accuracy"] for r in filled], 100 * accuracy, atol=1e-4)
    np.testing.assert_allclose([r["confidence"] for r in filled], 100 * mean_confidence, atol=1e-3)
    edges = np.linspace(0, 1, 11)
    ece = 0.0
    for low, high in zip(edges[:-1], edges[1:]):
        inside = (confidence > low) & (confidence <= high) | ((low == 0) & (confidence == 0))
        if inside.any():
            ece += inside.mean() * abs(correct[inside].mean() - confidence[inside].mean())
    assert report.overall["ece"] == pytest.approx(100 * ece, abs=1e-3)
    assert report.overall["mean_confidence"] == pytest.approx(100 * confidence.mean(), abs=1e-3)
    assert all(round(r["confidence"], 4) == r["confidence"] for r in filled)  # as the csv shows it
    assert [(r["low"], r["high"]) for r in report.calibration] == [
        (round(low, 6), round(high, 6)) for low, high in zip(edges[:-1], edges[1:])
    ]
    assert sum(r["count"] for r in report.calibration) == SAMPLES


def test_mistakes_are_every_wrong_sample_most_confident_first(device: torch.device) -> None:
    logits, targets = logits_and_targets(seed=2)
    names = [f"img_{i}.png" for i in range(SAMPLES)]
    classes = [f"c{i}" for i in range(NUM_CLASSES)]
    report = build_report(collect(logits, targets, device), classes, sample_name=names.__getitem__)
    wrong = np.flatnonzero(logits.argmax(dim=1).numpy() != targets.numpy())
    assert sorted(r["index"] for r in report.mistakes) == wrong.tolist()
    confidences = [r["confidence"] for r in report.mistakes]
    assert confidences == sorted(confidences, reverse=True)
    first = report.mistakes[0]
    assert first["sample"] == names[first["index"]] and first["label"] == classes[int(targets[first["index"]])]
    assert first["predicted"] == classes[int(logits[first["index"]].argmax())]
    probs = logits.softmax(dim=1)
    for row in report.mistakes[:20]:
        label = int(targets[row["index"]])
        assert row["label_probability"] == pytest.approx(100 * float(probs[row["index"], label]), abs=1e-3)
        assert row["label_rank"] == 1 + int((probs[row["index"]] > probs[row["index"], label]).sum())
    worst = build_report(collect(logits, targets, device), classes, worst=7)
    assert worst.mistakes == [{**r, "sample": str(r["index"])} for r in report.mistakes[:7]]


def test_confused_pairs_are_the_largest_off_diagonal_cells(device: torch.device) -> None:
    logits, targets = logits_and_targets(seed=3)
    report = build_report(collect(logits, targets, device), [f"c{i}" for i in range(NUM_CLASSES)])
    matrix = confusion_matrix(targets.numpy(), logits.argmax(dim=1).numpy(), labels=list(range(NUM_CLASSES)))
    np.fill_diagonal(matrix, 0)
    assert [p["count"] for p in report.pairs] == sorted(matrix[matrix > 0].tolist(), reverse=True)[: len(report.pairs)]
    top = report.pairs[0]
    assert matrix[top["true_index"], top["predicted_index"]] == matrix.max()
    assert (top["true"], top["predicted"]) == (f"c{top['true_index']}", f"c{top['predicted_index']}")
    support = np.bincount(targets.numpy(), minlength=NUM_CLASSES)
    assert top["share_of_true"] == pytest.approx(100 * top["count"] / support[top["true_index"]], abs=1e-3)


@pytest.mark.cpu_only(reason="reads and writes files from host arrays")
@pytest.mark.parametrize("num_classes", [NUM_CLASSES, DENSE_CONFUSION_MAX + 1])
def test_report_files_read_back_and_pictures_are_drawn(num_classes: int, tmp_path: Path) -> None:
    """Files pandas reads; a square confusion.csv up to 1000 classes, its non-zero cells beyond; both
    read back to the same matrix, and both pictures are drawn (the large one: the most confused classes)."""
    import pandas as pd

    from vtools.observe.report_plots import FOCUS_CLASSES, draw_report, focus_classes

    logits, targets = logits_and_targets(num_classes=num_classes, samples=3000)
    classes = [f"class {i}" for i in range(num_classes)]
    report = build_report(collect(logits, targets, torch.device("cpu")), classes)
    written = write_report(tmp_path, report)
    assert [p.name for p in written] == report_file_names(num_classes)
    assert (CONFUSION if num_classes <= DENSE_CONFUSION_MAX else CONFUSION_CELLS) in [p.name for p in written]
    for path in written:
        pd.read_csv(path)
    names, confusion = read_confusion(tmp_path)
    assert names == classes
    np.testing.assert_array_equal(confusion.cells, report.confusion.cells)
    np.testing.assert_array_equal(confusion.counts, report.confusion.counts)
    if num_classes <= DENSE_CONFUSION_MAX:
        square = pd.read_csv(tmp_path / CONFUSION, index_col=0)
        assert list(square.index) == classes and square.to_numpy().sum() == 3000
    else:
        kept = focus_classes(confusion)
        assert len(kept) == FOCUS_CLASSES
        assert {report.pairs[0]["true_index"], report.pairs[0]["predicted_index"]} <= set(kept)
    for picture in draw_report(tmp_path):
        assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.cpu_only(reason="compares files")
def test_compare_reports_class_by_class(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two reports of the same images: every delta is the second's score minus the first's, and the
    classes listed as improved are those whose top-1 rose most; a run folder's eval/ is found."""
    from vtools.cli.runner import command_main

    main = command_main("compare")

    logits, targets = logits_and_targets(seed=4)
    classes = [f"c{i}" for i in range(NUM_CLASSES)]
    better = logits.clone()
    fixed = (targets == 3) | (targets == 7)
    better[fixed, targets[fixed]] += 50.0  # classes 3 and 7 become all right
    before = build_report(collect(logits, targets, torch.device("cpu")), classes)
    after = build_report(collect(better, targets, torch.device("cpu")), classes)
    write_report(tmp_path / "before", before)
    write_report(tmp_path / "run_after" / "eval", after)
    out = tmp_path / "changes.csv"
    assert main([str(tmp_path / "before"), str(tmp_path / "run_after"), "--top", "2", "-o", str(out)]) == 0
    with out.open(newline="") as handle:
        rows = {row["class"]: row for row in csv.DictReader(handle)}
    for index, name in enumerate(classes):
        expected = after.per_class[index]["top1"] - before.per_class[index]["top1"]
        assert float(rows[name]["delta top1 run_after"] or 0) == pytest.approx(expected, abs=0.01), name
    gains = sorted(((after.per_class[i]["top1"] - before.per_class[i]["top1"], c) for i, c in enumerate(classes)))
    text = capsys.readouterr().out
    assert f"B against A, by top1: improved {gains[-1][1]} +" in text and {gains[-1][1], gains[-2][1]} == {"c3", "c7"}
    assert "worsened none" in text


@pytest.mark.cpu_only(reason="compares files")
def test_compare_multi_label_reports_by_map_and_ap(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Multi-label reports compare by their own figures: mAP rows, per-class AP and F1 deltas (AP against
    scikit-learn's), and the classes ranked by AP; a single-label report beside them is refused."""
    import numpy as np
    from sklearn.metrics import average_precision_score

    from vtools.cli.runner import command_main

    main = command_main("compare")
    from vtools.errors import UsageError
    from vtools.evaluation.multilabel_eval import write_multilabel_report
    from vtools.evaluation.multilabel_metrics import multilabel_report

    rng = np.random.default_rng(0)
    names = ["cat", "dog", "owl", "fox"]
    targets = (rng.random((60, 4)) < 0.4).astype(np.uint8)
    before = rng.random((60, 4))
    after = before.copy()
    after[:, 1] = 0.05 + 0.9 * targets[:, 1]  # dog ranked perfectly
    for folder, scores in (("a", before), ("b", after)):
        write_multilabel_report(tmp_path / folder, multilabel_report(scores, targets, 0.5, names), {"epoch": 0})
    out = tmp_path / "changes.csv"
    assert main([str(tmp_path / "a"), str(tmp_path / "b"), "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "map_macro" in text and "top1" not in text
    rows = {row["class"]: row for row in csv.DictReader(out.open(newline=""))}
    gain = 100 * (
        average_precision_score(targets[:, 1], after[:, 1]) - average_precision_score(targets[:, 1], before[:, 1])
    )
    assert float(rows["dog"]["delta ap b"]) == pytest.approx(gain, abs=0.01) and gain > 10
    assert f"B against A, by ap: improved dog +{gain:.2f}; worsened none" in text
    logits, labels = logits_and_targets(seed=4)
    single = build_report(collect(logits, labels, torch.device("cpu")), [f"c{i}" for i in range(NUM_CLASSES)])
    write_report(tmp_path / "single", single)
    with pytest.raises(UsageError, match="is a single-label report and .*/b a multi-label one"):
        main([str(tmp_path / "single"), str(tmp_path / "b")])


@pytest.mark.cpu_only(reason="compares files")
def test_compare_shows_a_class_one_report_lacks_as_a_dash(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A class only the first report has: its later cells are empty in the csv (NaN to pandas) and '-' on
    the console, not the word None."""
    import pandas as pd

    from vtools.cli.runner import command_main

    main = command_main("compare")

    logits, targets = logits_and_targets(seed=5)
    classes = [f"c{i}" for i in range(NUM_CLASSES)]
    write_report(tmp_path / "a", build_report(collect(logits, targets, torch.device("cpu")), classes))
    write_report(tmp_path / "b", build_report(collect(logits, targets, torch.device("cpu")), classes))
    per_class = tmp_path / "b" / "per_class.csv"
    per_class.write_text("".join(line for line in per_class.read_text().splitlines(True) if not line.startswith("c0,")))
    assert main([str(tmp_path / "a"), str(tmp_path / "b"), "-o", str(tmp_path / "changes.csv")]) == 0
    text = capsys.readouterr().out
    assert "None" not in text
    c0 = next(line for line in text.splitlines() if line.startswith("c0 "))
    assert c0.split()[3:5] == ["-", "-"]  # class, support, top1 a, then top1 b and its delta
    frame = pd.read_csv(tmp_path / "changes.csv").set_index("class")
    assert frame.loc["c0", ["top1 b", "delta top1 b"]].isna().all()


@pytest.mark.cpu_only(reason="names and host arrays")
def test_a_run_with_more_outputs_than_classes_reports_every_output() -> None:
    """--num-classes above the data's class count: predictions may land on the extra outputs, which the
    run's report names by index (a report over the data's classes alone would misfile them)."""
    from vtools.train.run_files import output_names

    names = output_names(["cat", "dog"], 4)
    assert names == ["cat", "dog", "2", "3"]
    logits = torch.tensor([[0.0, 0.0, 0.0, 5.0], [5.0, 0.0, 0.0, 0.0]])
    report = build_report(collect(logits, torch.tensor([0, 1]), torch.device("cpu")), names)
    assert [p["predicted"] for p in report.mistakes] == ["3", "cat"]
    assert report.confusion.dense().tolist() == [[0, 0, 0, 1], [1, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]]


def test_a_rank_without_samples_gathers_empty_columns(device: torch.device) -> None:
    """Under torchrun a rank may validate no image: its log gathers to columns of length 0 (the shapes the
    other ranks' rows have), and a report of nothing has no rows."""
    gathered = PredictionLog().gather(device)
    assert len(gathered) == 0
    columns = [gathered.index, gathered.target, gathered.predicted, gathered.target_rank]
    assert all(column.shape == (0,) and column.dtype == np.int64 for column in columns)
    assert gathered.confidence.shape == gathered.target_prob.shape == (0,)
