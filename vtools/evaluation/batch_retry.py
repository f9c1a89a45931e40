"""timm's --retry: an evaluation that runs out of memory is tried again with a smaller batch.

The batch sizes are timm's (``decay_batch_step``) and so is the test of which errors a
smaller batch can cure (``check_batch_size_retry``); any other error stops the run as it is.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import TypeVar

import torch
from timm.utils import check_batch_size_retry, decay_batch_step

T = TypeVar("T")


def with_smaller_batches(
    attempt: Callable[[int], T], batch_size: int, retry: bool, name: str, say: Callable[[str], None] = print
) -> T:
    """``attempt(batch_size)``, and with ``retry`` on an out-of-memory error ``attempt`` again with the
    next smaller batch size, saying so (``name``: what is evaluated, in that line)."""
    while True:
        try:
            return attempt(batch_size)
        except RuntimeError as err:
            smaller = decay_batch_step(batch_size)
            if not retry or not smaller or not check_batch_size_retry(str(err)) or not out_of_memory(err):
                raise
            say(f"{name}: {str(err).splitlines()[0]} at batch size {batch_size}; retrying with {smaller}")
            batch_size = smaller
            gc.collect()
            if hasattr(torch, "accelerator") and torch.accelerator.is_available():
                torch.accelerator.empty_cache()


def out_of_memory(err: RuntimeError) -> bool:
    return isinstance(err, torch.OutOfMemoryError) or "out of memory" in str(err).lower()
