"""Per-class loss weights for imbalanced data (--class-weights balanced|FILE), and the line naming rare classes.

A set where one class has a hundred times the images of another trains a model that rarely predicts the
small one. Weighting the loss by inverse class frequency is the usual remedy; ``balanced`` computes it as
scikit-learn's ``compute_class_weight('balanced')`` does (n_samples / (n_classes * count)), over the
classes the training set holds. A class with no training image gets weight 0: there is nothing of it to
balance. A FILE gives the weights instead: JSON (``{"class": weight}`` or a list, one per class) or CSV
(``class,weight`` rows, a header allowed). Classes a name-keyed file leaves out keep weight 1; a class given twice,
a weight that is not a number 0 or more, and weights that are all 0 are refused. A class of weight 0 teaches
nothing, and neither does a batch made of such classes only: its loss is 0 (recipe.WeightedCrossEntropy).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from vtools.errors import UsageError

FLAG = "--class-weights"
RARE_SHOWN = 5  # classes the start line names


def class_counts(labels: np.ndarray, num_classes: int) -> np.ndarray:
    """Images per class (unlabelled samples, label -1, are not counted)."""
    labels = np.asarray(labels)
    return np.bincount(labels[labels >= 0], minlength=num_classes)[:num_classes]


def balanced_weights(counts: np.ndarray) -> np.ndarray:
    """n_samples / (n_classes * count) over the classes present; 0 for a class with no sample."""
    present = counts > 0
    weights = np.zeros(len(counts), dtype=np.float64)
    weights[present] = counts.sum() / (present.sum() * counts[present])
    return weights


def class_weights_for(spec: str, labels: np.ndarray | None, classes: Sequence[str], where: str) -> np.ndarray:
    """The weights --class-weights asks for: ``balanced`` from the training labels (``where`` names the
    set in the message when its labels are not known before training), else read from a file."""
    if spec == "balanced":
        if labels is None:
            raise UsageError(
                f"{FLAG} balanced needs the training labels before training, which {where} does not give; "
                "pass a weights file instead (JSON or CSV, one weight per class)"
            )
        return balanced_weights(class_counts(labels, len(classes)))
    return read_weights_file(spec, classes)


def read_weights_file(path: str, classes: Sequence[str]) -> np.ndarray:
    """Weights from a JSON object (class name -> weight), a JSON list (one per class), or CSV rows
    ``class,weight`` (a header row is allowed)."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise UsageError(f"{FLAG} {path}: cannot read it ({err.__class__.__name__}: {err})") from None
    if file.suffix.lower() == ".json":
        try:
            given = json.loads(text, object_pairs_hook=lambda pairs: _once_each(pairs, path))
        except json.JSONDecodeError as err:
            raise UsageError(f"{FLAG} {path}: not valid JSON ({err})") from None
    else:
        rows = [(row[0].strip(), row[1].strip()) for row in csv.reader(text.splitlines()) if len(row) >= 2]
        if rows and rows[0][0] not in classes and _not_a_number(rows[0][1]):
            rows = rows[1:]  # the header row
        given = _once_each(rows, path)
    if isinstance(given, list):
        if len(given) != len(classes):
            raise UsageError(f"{FLAG} {path}: {len(given)} weights for {len(classes)} classes; give one per class")
        return _some_weight(np.array([_weight(value, path, str(i)) for i, value in enumerate(given)]), path)
    if not isinstance(given, dict) or not given:
        raise UsageError(f"{FLAG} {path}: expected class,weight rows or a JSON object/list of weights")
    index = {name: i for i, name in enumerate(classes)}
    unknown = [name for name in given if name not in index]
    if unknown:
        shown = ", ".join(repr(name) for name in unknown[:3])
        raise UsageError(f"{FLAG} {path}: {shown} not among the {len(classes)} classes (e.g. {classes[0]!r})")
    weights = np.ones(len(classes), dtype=np.float64)
    for name, value in given.items():
        weights[index[name]] = _weight(value, path, name)
    return _some_weight(weights, path)


def _once_each(pairs: Sequence[tuple[str, object]], path: str) -> dict[str, object]:
    """A class's weight given twice is refused: which one the user meant cannot be known."""
    given: dict[str, object] = {}
    for name, value in pairs:
        if name in given:
            raise UsageError(f"{FLAG} {path}: {name!r} is given twice ({given[name]!r} and {value!r}); give it once")
        given[name] = value
    return given


def _some_weight(weights: np.ndarray, path: str) -> np.ndarray:
    if not weights.any():
        raise UsageError(f"{FLAG} {path}: every weight is 0, so the loss would teach nothing; give some class a weight")
    return weights.astype(np.float64)


def _not_a_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return True
    return False


def _weight(value: object, path: str, name: str) -> float:
    try:
        weight = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise UsageError(f"{FLAG} {path}: the weight of {name!r} is {value!r}, not a number") from None
    if not np.isfinite(weight) or weight < 0:
        raise UsageError(f"{FLAG} {path}: the weight of {name!r} is {value!r}; weights are 0 or more")
    return weight


def rare_classes_note(counts: np.ndarray, classes: Sequence[str], what: str) -> str:
    """One line naming the rare classes (under half the largest class's count; else the rarest one), so
    a user sees what the balancing is for: ``what`` says which balancing; '' when every class has as many
    images."""
    present = np.flatnonzero(counts > 0)
    if len(present) == 0 or counts[present].min() == counts[present].max():
        return ""
    order = present[np.argsort(counts[present], kind="stable")]
    rare = [i for i in order if counts[i] * 2 < counts.max()] or [order[0]]
    shown = ", ".join(f"{classes[i]} ({int(counts[i])})" for i in rare[:RARE_SHOWN])
    more = f" and {len(rare) - RARE_SHOWN} more" if len(rare) > RARE_SHOWN else ""
    empty = len(counts) - len(present)
    missing = f"; {empty} class(es) have no training image" if empty else ""
    return f"{what}: rare classes {shown}{more} (largest class: {int(counts.max())} images){missing}"
