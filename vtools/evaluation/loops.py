"""The evaluation loop shared by validate.py and the per-epoch validation in train.py."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from vtools.progress import progress
from vtools.runtime.amp import AmpPolicy
from vtools.runtime.device import synchronize
from vtools.runtime.distributed import all_reduce_sum
from vtools.runtime.overflow import float_status_flag


@dataclass(frozen=True)
class EvalResult:
    """Totals over the whole set (all ranks), each sample counted once. Multi-label data has no top-k
    (NaN) and its loss is the mean binary cross-entropy; its mAP and F1 come from its scores afterwards
    (vtools.evaluation.multilabel_eval)."""

    top1: float  # percent
    top5: float  # percent
    loss: float
    count: int
    seconds: float
    map: float | None = None  # percent: mAP macro (multi-label data only)
    map_micro: float | None = None  # percent
    f1: float | None = None  # percent: F1 macro at --threshold
    saturated: bool = False  # on a chip that saturates: its float-status flag rose during the pass (any rank)

    @property
    def multi_label(self) -> bool:
        return self.map is not None

    @property
    def overflowed(self) -> bool:
        """Whether the outputs overflowed: a loss that is not finite, or a saturating chip's raised flag."""
        return self.saturated or not math.isfinite(self.loss)

    def overflow_words(self) -> str:
        """What the loss says of an overflow, for a one-line error: ``is nan``, or the saturated chip's flag."""
        if not math.isfinite(self.loss) or not self.saturated:
            return f"is {self.loss}"
        return (
            f"overflowed (the chip saturates: its float-status flag rose during the pass, and the loss read "
            f"{self.loss:.6g})"
        )

    @property
    def images_per_second(self) -> float:
        return self.count / self.seconds if self.seconds > 0 else 0.0


def topk_correct(logits: torch.Tensor, targets: torch.Tensor, ks: tuple[int, ...] = (1, 5)) -> list[torch.Tensor]:
    """Number of samples whose target is among the top-k logits, per k (stays on the device)."""
    maxk = min(max(ks), logits.shape[1])
    top = logits.topk(maxk, dim=1).indices
    hits = top.eq(targets.unsqueeze(1))
    return [hits[:, : min(k, maxk)].any(dim=1).sum() for k in ks]


@torch.inference_mode()
def evaluate(
    model: torch.nn.Module,
    loader: Iterable,
    device: torch.device,
    amp: AmpPolicy,
    desc: str = "validate",
    show_progress: bool = True,
    log: Callable[[str], None] | None = None,
    log_freq: int = 0,
    should_stop: Callable[[], bool] | None = None,
    output_index: Sequence[int] | None = None,
    on_logits: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], None] | None = None,
) -> EvalResult | None:
    """Top-1, top-5 and mean cross-entropy over ``loader`` (summed over ranks).

    ``should_stop`` (a single process only: ranks would part ways) is asked
    between batches; when it says yes the pass ends early and returns None.
    ``output_index`` (timm's --valid-labels) keeps only those outputs, in that
    order, before anything is scored; ``on_logits(logits, targets, indices)``
    sees each batch's float32 logits (after that selection) for further metrics.
    """
    model.eval()
    keep = None if output_index is None else torch.as_tensor(list(output_index), dtype=torch.int64, device=device)
    totals = torch.zeros(3, dtype=torch.float32, device=device)  # top1 hits, top5 hits, loss sum
    status = float_status_flag(device, amp.overflow)  # a saturating chip's: read once, at the end
    if status is not None:
        status.clear()
    count = 0  # known on the host: no device sync per batch
    multi_label = False
    start = time.perf_counter()
    bar = progress(loader, desc, total=len(loader) if hasattr(loader, "__len__") else None, enabled=show_progress)
    for step, batch in enumerate(bar):
        if should_stop is not None and should_stop():
            return None
        if batch.images.numel() == 0:
            continue
        with amp.autocast():
            logits = model(batch.images)
        logits = logits.float()
        if keep is not None:
            logits = logits.index_select(1, keep)
        if on_logits is not None:
            on_logits(logits, batch.targets, batch.indices)
        multi_label = batch.targets.ndim == 2  # multi-hot rows: no top-k, binary cross-entropy per class
        if multi_label:
            loss_sum = F.binary_cross_entropy_with_logits(logits, batch.targets, reduction="sum") / logits.shape[1]
            top1 = top5 = loss_sum.new_zeros(())
        else:
            loss_sum = F.cross_entropy(logits, batch.targets, reduction="sum")
            top1, top5 = topk_correct(logits, batch.targets)
        totals += torch.stack([top1.float(), top5.float(), loss_sum])
        count += len(batch.targets)
        if log is not None and log_freq and step % log_freq == 0:
            seen = max(count, 1)
            hits = totals[:2].tolist()
            top = "" if multi_label else f"top1 {100 * hits[0] / seen:.2f} top5 {100 * hits[1] / seen:.2f} "
            log(f"{desc}: [{step}/{len(bar)}] {top}loss {totals[2].item() / seen:.4f}")
    synchronize(device)
    seconds = time.perf_counter() - start
    raised = status.raised().float().reshape(1) if status is not None else totals.new_zeros(1)
    top1, top5, loss, count, raised = all_reduce_sum(torch.cat([totals, totals.new_tensor([count]), raised])).tolist()
    count, saturated = int(round(count)), raised > 0
    if count == 0:
        return EvalResult(0.0, 0.0, float("nan"), 0, seconds)
    if multi_label:
        return EvalResult(float("nan"), float("nan"), loss / count, count, seconds, saturated=saturated)
    return EvalResult(100 * top1 / count, 100 * top5 / count, loss / count, count, seconds, saturated=saturated)


@torch.inference_mode()
def predict(
    model: torch.nn.Module,
    loader: Iterable,
    amp: AmpPolicy,
    topk: int,
    output_type: str = "prob",
    show_progress: bool = True,
    host_every: int = 64,
    multi_label: bool = False,
) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]:
    """Yield (dataset indices, scores, class indices) per batch on the CPU.

    ``topk == 0`` yields every class's score in class order (class indices None). A ``multi_label``
    model's probabilities are each class's sigmoid, not a softmax over the classes.
    Results stay on the device and come to the host ``host_every`` batches at a
    time: one synchronisation per chunk instead of one per batch.
    """
    model.eval()
    pending: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]] = []
    for batch in progress(
        loader, "inference", total=len(loader) if hasattr(loader, "__len__") else None, enabled=show_progress
    ):
        if batch.images.numel() == 0:
            continue
        with amp.autocast():
            logits = model(batch.images)
        scores = logits.float()
        if output_type == "prob":
            scores = scores.sigmoid() if multi_label else scores.softmax(dim=1)
        if topk:
            top = scores.topk(min(topk, scores.shape[1]), dim=1)
            pending.append((batch.indices, top.values, top.indices))
        else:
            pending.append((batch.indices, scores, None))
        if len(pending) == host_every:
            yield from _to_host(pending)
            pending = []
    yield from _to_host(pending)


def _to_host(
    pending: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]],
) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]:
    """Move a chunk of per-batch results to the host in one copy per kind, then split it again."""
    if not pending:
        return
    sizes = [len(scores) for _, scores, _ in pending]
    scores = torch.cat([scores for _, scores, _ in pending]).cpu().split(sizes)
    has_classes = pending[0][2] is not None
    classes = torch.cat([c for _, _, c in pending]).cpu().split(sizes) if has_classes else [None] * len(sizes)
    for (indices, _, _), chunk_scores, chunk_classes in zip(pending, scores, classes):
        yield indices, chunk_scores, chunk_classes
