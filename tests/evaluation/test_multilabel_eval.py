"""A multi-label validation pass: the loss evaluate() reports, the scores ScoreLog keeps on the device and
gathers, the figures scored() adds, the report's files, and inference's classes above the threshold."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from sklearn.metrics import average_precision_score, f1_score

from vtools.data.loaders import Batch
from vtools.evaluation.loops import EvalResult, evaluate
from vtools.evaluation.multilabel_eval import ScoreLog, above_threshold, scored, write_multilabel_report
from vtools.runtime.amp import AmpPolicy

CLASSES = 5


class Fixed(torch.nn.Module):
    """A 'model' that returns the logits it was built with, batch by batch (in order)."""

    def __init__(self, logits: torch.Tensor) -> None:
        super().__init__()
        self.logits, self.at = logits, 0

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        out = self.logits[self.at : self.at + len(images)]
        self.at += len(images)
        return out


def batches(device: torch.device, logits: torch.Tensor, targets: torch.Tensor, size: int = 16) -> list[Batch]:
    return [
        Batch(
            torch.zeros(len(targets[i : i + size]), 3, 4, 4, device=device),
            targets[i : i + size],
            torch.arange(i, i + len(targets[i : i + size])),
        )
        for i in range(0, len(targets), size)
    ]


def sample(device: torch.device, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(50, CLASSES, generator=generator)
    targets = (torch.rand(50, CLASSES, generator=generator) < 0.3).float()
    targets[:, 4] = 0  # a class with no positive
    return logits.to(device), targets.to(device)


@pytest.mark.filterwarnings("ignore:No positive class found")
def test_the_pass_reports_bce_and_the_scores_give_sklearns_figures(device: torch.device) -> None:
    logits, targets = sample(device)
    log = ScoreLog()
    result = evaluate(
        Fixed(logits),
        batches(device, logits, targets),
        device,
        AmpPolicy(device.type, None),
        show_progress=False,
        on_logits=log,
    )
    assert result is not None and result.count == 50 and np.isnan(result.top1) and np.isnan(result.top5)
    expected_loss = F.binary_cross_entropy_with_logits(logits.float().cpu(), targets.cpu()).item()
    assert result.loss == pytest.approx(expected_loss, rel=1e-5)  # timm's BCE: the mean over every class

    gathered = log.gather(device, CLASSES)
    np.testing.assert_array_equal(gathered.index, np.arange(50))
    probs, truth = torch.sigmoid(logits.float()).cpu().numpy(), targets.cpu().numpy()
    np.testing.assert_allclose(gathered.scores, probs, rtol=1e-6)
    np.testing.assert_array_equal(gathered.targets, truth)

    figures, report = scored(result, gathered, 0.5, [f"c{i}" for i in range(CLASSES)])
    assert figures.multi_label and not result.multi_label
    assert figures.map == pytest.approx(100 * average_precision_score(truth, probs, average="macro"), rel=1e-5)
    assert figures.map_micro == pytest.approx(100 * average_precision_score(truth, probs, average="micro"), rel=1e-5)
    f1 = f1_score(truth, probs >= 0.5, average="macro", zero_division=0)
    assert figures.f1 == pytest.approx(100 * f1, rel=1e-5)
    assert report.class_names[4] == "c4" and report.support[4] == 0


@pytest.mark.cpu_only(reason="writing csv files is host-side")
def test_the_report_files_read_back_with_pandas(tmp_path: Path) -> None:
    logits, targets = sample(torch.device("cpu"))
    log = ScoreLog()
    log.add(logits, targets, torch.arange(50))
    _, report = scored(EvalResult(0.0, 0.0, 0.1, 50, 1.0), log.gather(torch.device("cpu"), CLASSES), 0.5, list("abcde"))
    write_multilabel_report(tmp_path, report, {"epoch": 3})
    per_class, overall = pd.read_csv(tmp_path / "per_class.csv"), pd.read_csv(tmp_path / "overall.csv")
    assert list(per_class["class"]) == list("abcde") and per_class["support"].iloc[4] == 0
    assert overall["epoch"].iloc[0] == 3 and overall["map_macro"].iloc[0] == pytest.approx(100 * report.map_macro)


@pytest.mark.parametrize("output_type", ["prob", "logit"])
def test_inference_lists_every_class_at_or_above_the_threshold(device: torch.device, output_type: str) -> None:
    logits = torch.tensor([[2.0, -1.0, 0.0, 3.0], [-2.0, -3.0, -1.0, -4.0]], device=device)
    scores = logits.sigmoid() if output_type == "prob" else logits
    ((indices, values, classes),) = list(above_threshold([(torch.arange(2), scores.cpu(), None)], 0.5, output_type))
    assert classes[0].tolist() == [3, 0, 2]  # most probable first; probability 0.5 exactly counts
    assert classes[1].tolist() == []  # no class above: an image may have none
    torch.testing.assert_close(values[0], scores.cpu()[0, [3, 0, 2]])
