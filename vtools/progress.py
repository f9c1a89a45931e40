"""Progress bars that stay out of the way: shown on a terminal, silent in logs and pipes."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tqdm import tqdm


def progress(iterable: Iterable, desc: str, total: int | None = None, enabled: bool = True, **kwargs: Any) -> tqdm:
    """A tqdm bar on stderr; ``disable=None`` hides it when stderr is not a terminal."""
    return tqdm(
        iterable,
        desc=desc,
        total=total,
        disable=None if enabled else True,
        dynamic_ncols=True,
        leave=False,
        unit="batch",
        **kwargs,
    )
