"""vtools/evaluation/multilabel_metrics.py against scikit-learn: per-class AP and both mAPs, precision/recall/F1
at a threshold with their averages, and the best-F1 thresholds, on scores with ties and on classes with no
positive (scored 0, as scikit-learn scores them) or only positives."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from sklearn.metrics import average_precision_score, f1_score, precision_recall_fscore_support

from vtools.evaluation.multilabel_metrics import MultiLabelReport, multi_hot, multilabel_report
from vtools.results import format_rows

pytestmark = pytest.mark.cpu_only(reason="numpy arithmetic on the host")

SAMPLES, CLASSES = 200, 7
NO_POSITIVE, ALL_POSITIVE = (2, 5), 4
TIGHT = dict(rtol=1e-12, atol=1e-12)


def scores_and_targets(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Scores that track the labels loosely, rounded to 2 decimals so ~200 samples share ~100 values (ties,
    positives and negatives among them); classes 2 and 5 have no positive, class 4 only positives, and
    class 5 scores above 0.5 at times (predictions without labels) while class 2 never does."""
    rng = np.random.default_rng(seed)
    targets = (rng.random((SAMPLES, CLASSES)) < rng.uniform(0.1, 0.6, CLASSES)).astype(np.uint8)
    targets[:, list(NO_POSITIVE)] = 0
    targets[:, ALL_POSITIVE] = 1
    scores = np.clip(0.35 * targets + 0.65 * rng.random((SAMPLES, CLASSES)), 0, 1).round(2)
    scores[:, 2] *= 0.4  # at most 0.26: below both thresholds tested
    scores[:5, 0] = 0.5  # exactly at the threshold: predicted
    return scores, targets


def sklearn_ap(targets: np.ndarray, scores: np.ndarray, **kwargs) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="No positive class found")
        return np.asarray(average_precision_score(targets, scores, **kwargs))


def ap_without_ties(labels: np.ndarray, scores: np.ndarray) -> float:
    """The planted bug: one threshold per sample, tied samples taken in sort order."""
    order = np.argsort(-scores, kind="stable")
    hits = np.cumsum(labels[order])
    return float((labels[order] * hits / np.arange(1, len(labels) + 1)).sum() / labels.sum())


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_average_precision_is_sklearns(seed: int) -> None:
    scores, targets = scores_and_targets(seed)
    report = multilabel_report(scores, targets)
    expected = sklearn_ap(targets, scores, average=None)
    has_positive = targets.sum(axis=0) > 0

    assert report.ap[list(NO_POSITIVE)].tolist() == [0.0, 0.0]  # scikit-learn's score for them
    assert expected[list(NO_POSITIVE)].tolist() == [0.0, 0.0]
    np.testing.assert_allclose(report.ap, expected, **TIGHT)
    assert report.ap[ALL_POSITIVE] == 1.0
    np.testing.assert_allclose(report.map_macro, sklearn_ap(targets, scores, average="macro"), **TIGHT)
    np.testing.assert_allclose(report.map_micro, sklearn_ap(targets, scores, average="micro"), **TIGHT)
    assert has_positive.sum() < CLASSES  # the macro above includes classes without positives


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_the_input_has_ties_that_change_the_ap(seed: int) -> None:
    """Without tie handling the AP moves away from scikit-learn's, so the comparison above covers ties."""
    scores, targets = scores_and_targets(seed)
    expected = sklearn_ap(targets, scores, average=None)
    off = [abs(ap_without_ties(targets[:, c], scores[:, c]) - expected[c]) for c in (0, 1, 3, 6)]
    assert max(off) > 1e-3
    assert abs(ap_without_ties(targets.ravel(), scores.ravel()) - sklearn_ap(targets, scores, average="micro")) > 1e-4


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("threshold", [0.5, 0.3])
def test_precision_recall_f1_at_a_threshold_are_sklearns(seed: int, threshold: float) -> None:
    scores, targets = scores_and_targets(seed)
    report = multilabel_report(scores, targets, threshold=threshold)
    predicted = (scores >= threshold).astype(np.uint8)
    assert predicted[:, 2].sum() == 0 and predicted[:, 5].sum() > 0  # neither labels nor predictions; only predictions

    precision, recall, f1, support = precision_recall_fscore_support(targets, predicted, average=None, zero_division=0)
    np.testing.assert_allclose(report.precision, precision, **TIGHT)
    np.testing.assert_allclose(report.recall, recall, **TIGHT)
    np.testing.assert_allclose(report.f1, f1, **TIGHT)
    assert report.support.tolist() == support.tolist()
    assert report.predicted.tolist() == predicted.sum(axis=0).tolist()
    for average in ("macro", "micro"):
        precision, recall, f1, _ = precision_recall_fscore_support(targets, predicted, average=average, zero_division=0)
        got = [getattr(report, f"{name}_{average}") for name in ("precision", "recall", "f1")]
        np.testing.assert_allclose(got, [precision, recall, f1], **TIGHT)
        np.testing.assert_allclose(
            getattr(report, f"f1_{average}"), f1_score(targets, predicted, average=average, zero_division=0), **TIGHT
        )


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_best_f1_threshold_is_the_brute_force_one(seed: int) -> None:
    scores, targets = scores_and_targets(seed)
    report = multilabel_report(scores, targets)
    for c in range(CLASSES):
        if targets[:, c].sum() == 0:
            assert np.isnan(report.best_threshold[c]) and report.best_f1[c] == 0.0
            continue
        candidates = np.unique(scores[:, c])[::-1]  # highest first: the first maximum is the highest threshold
        f1 = [f1_score(targets[:, c], scores[:, c] >= t, zero_division=0) for t in candidates]
        best = int(np.argmax(f1))
        assert report.best_threshold[c] == candidates[best], c
        np.testing.assert_allclose(report.best_f1[c], f1[best], **TIGHT)
    assert report.best_threshold[ALL_POSITIVE] == scores[:, ALL_POSITIVE].min()  # predict all: F1 1
    assert report.best_f1[ALL_POSITIVE] == 1.0


def test_best_f1_ties_go_to_the_highest_threshold() -> None:
    """F1 2/3 at 0.9 (1 of 1 predicted right) and at 0.6 (2 of 4): the fewer predictions win."""
    scores = np.array([0.9, 0.8, 0.7, 0.6, 0.1])[:, None]
    targets = np.array([1, 0, 0, 1, 0])[:, None]
    report = multilabel_report(scores, targets)
    assert report.best_threshold[0] == 0.9 and report.best_f1[0] == pytest.approx(2 / 3)


def test_a_perfect_predictor_scores_one() -> None:
    _, targets = scores_and_targets(0)
    scores = np.where(targets > 0, 0.9, 0.1)
    report = multilabel_report(scores, targets)
    has_positive = targets.sum(axis=0) > 0
    assert report.map_micro == 1.0 and report.map_macro == has_positive.mean()  # no-positive classes score 0
    present = multilabel_report(scores[:, has_positive], targets[:, has_positive])
    assert present.map_macro == 1.0
    assert report.f1_micro == 1.0
    assert report.f1[has_positive].tolist() == [1.0] * int(has_positive.sum())
    assert report.best_threshold[has_positive].tolist() == [0.9] * int(has_positive.sum())


def test_ties_across_labels_lower_the_ap() -> None:
    """A positive tied with a negative is found only together with it: AP is 1/2, not 1 or 1/2 by order."""
    targets = np.array([[1], [0], [0]])
    scores = np.array([[0.7], [0.7], [0.1]])
    assert multilabel_report(scores, targets).ap[0] == 0.5
    assert multilabel_report(scores[::-1].copy(), targets[::-1].copy()).ap[0] == 0.5


def test_no_positive_anywhere_gives_sklearns_zero_maps() -> None:
    scores, targets = np.full((4, 2), 0.3), np.zeros((4, 2))
    report = multilabel_report(scores, targets)
    assert report.map_macro == sklearn_ap(targets, scores, average="macro") == 0.0
    assert report.map_micro == sklearn_ap(targets, scores, average="micro") == 0.0
    assert report.f1_macro == 0.0 and report.precision_micro == 0.0


def test_rows_and_overall_are_csv_ready() -> None:
    scores, targets = scores_and_targets(0)
    names = [f"tag{c}" for c in range(CLASSES)]
    report = multilabel_report(scores, targets, class_names=names)
    rows = report.rows()
    assert [row["class"] for row in rows] == names
    assert set(rows[0]) == {
        "class",
        "index",
        "support",
        "predicted",
        "ap",
        "precision",
        "recall",
        "f1",
        "best_threshold",
        "best_f1",
    }
    assert rows[2]["ap"] == 0.0 and rows[2]["best_threshold"] is None and rows[2]["support"] == 0
    assert rows[ALL_POSITIVE]["ap"] == 100.0
    assert rows[0]["f1"] == round(100 * report.f1[0], 4)
    assert rows[0]["best_threshold"] == report.best_threshold[0]
    csv_text = format_rows(rows, "csv")
    assert csv_text.splitlines()[3].startswith("tag2,2,0,")
    overall = report.overall()
    assert overall["map_macro"] == round(100 * report.map_macro, 4)
    assert overall["classes_with_positives"] == CLASSES - len(NO_POSITIVE)


def test_report_is_read_only() -> None:
    scores, targets = scores_and_targets(0)
    report = multilabel_report(scores, targets)
    with pytest.raises(ValueError):
        report.ap[0] = 0.0
    with pytest.raises(AttributeError):
        report.map_macro = 0.0  # type: ignore[misc]
    assert isinstance(report, MultiLabelReport)


def test_multi_hot() -> None:
    out = multi_hot([[0, 2], [], [1, 1, 3]], 4)
    assert out.dtype == np.uint8
    assert out.tolist() == [[1, 0, 1, 0], [0, 0, 0, 0], [0, 1, 0, 1]]
    assert multi_hot([[1]], 2, dtype=np.float32).tolist() == [[0.0, 1.0]]
    assert multi_hot([], 3).shape == (0, 3)
    with pytest.raises(ValueError, match="class index 4"):
        multi_hot([[4]], 4)


@pytest.mark.parametrize(
    "scores, targets, match",
    [
        (np.zeros((3, 2)), np.zeros((3, 3)), "same N x K"),
        (np.zeros((0, 2)), np.zeros((0, 2)), "same N x K"),
        (np.array([[np.nan]]), np.array([[1]]), "NaN"),
        (np.zeros((2, 1)), np.array([[2], [0]]), "0/1"),
    ],
)
def test_bad_inputs_are_refused(scores: np.ndarray, targets: np.ndarray, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        multilabel_report(scores, targets)
