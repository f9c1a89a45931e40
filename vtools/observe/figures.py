"""matplotlib for the pictures vtools draws: loaded only when a picture is asked for, saved atomically."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from vtools.atomic import atomic_write
from vtools.optional import CORE, optional_module


def pyplot(purpose: str) -> Any:
    """matplotlib.pyplot on the file-only Agg backend; a one-line error naming ``purpose`` without it."""
    matplotlib = optional_module("matplotlib", purpose, CORE)
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_png(figure: Any, path: Path, dpi: int = 110) -> Path:
    """Render ``figure`` in memory, close it, and put the PNG at ``path`` in one rename."""
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi)
    plt.close(figure)
    data = buffer.getvalue()
    return atomic_write(path, lambda handle: handle.write(data))
