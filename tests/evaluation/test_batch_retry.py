"""vtools/evaluation/batch_retry.py: timm's out-of-memory retry (validate.py --retry, vtools benchmark), as a
policy: which errors a smaller batch may cure, in timm's batch steps, and nothing else retried."""

from __future__ import annotations

import pytest
import torch
from timm.utils import decay_batch_step

from vtools.evaluation.batch_retry import with_smaller_batches

pytestmark = pytest.mark.cpu_only(
    reason="the retry policy; the device's own out-of-memory: tests/scripts/test_benchmark.py"
)


def fits_at_most(largest: int, tried: list[int]):  # noqa: ANN201 - a test's attempt function
    def attempt(batch_size: int) -> int:
        tried.append(batch_size)
        if batch_size > largest:
            raise torch.OutOfMemoryError(f"out of memory at {batch_size}")
        return batch_size

    return attempt


def test_out_of_memory_steps_down_in_timms_steps_until_a_batch_fits() -> None:
    tried: list[int] = []
    said: list[str] = []
    assert with_smaller_batches(fits_at_most(40, tried), 256, True, "m", said.append) == tried[-1] <= 40
    expected = [256]
    while expected[-1] > 40:
        expected.append(decay_batch_step(expected[-1]))
    assert tried == expected and len(said) == len(expected) - 1
    assert said[0] == f"m: out of memory at 256 at batch size 256; retrying with {expected[1]}"


def test_without_retry_or_for_other_errors_the_first_error_stands() -> None:
    tried: list[int] = []
    with pytest.raises(torch.OutOfMemoryError):
        with_smaller_batches(fits_at_most(40, tried), 256, False, "m", print)
    assert tried == [256]

    def broken(batch_size: int) -> int:
        tried.append(batch_size)
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")

    tried.clear()
    with pytest.raises(RuntimeError, match="shapes"):
        with_smaller_batches(broken, 256, True, "m", print)
    assert tried == [256]


def test_no_batch_fits_ends_with_the_error_at_batch_size_one() -> None:
    tried: list[int] = []
    with pytest.raises(torch.OutOfMemoryError):
        with_smaller_batches(fits_at_most(0, tried), 4, True, "m", lambda _: None)
    assert tried == [4, 3, 2, 1]
