"""``python3 -m benchmarks``: vtools measured against plain baselines and timm, run from the repository root.

Every figure docs/performance.md quotes comes from here; what users run to measure a model is ``vtools
benchmark``. The options are parsed first, then torch is imported as the vtools commands import it.
"""

from __future__ import annotations

from vtools.cli.runner import run_cli
from vtools.runtime.torch_import import import_torch


def main(argv: list[str] | None) -> int | None:
    import_torch()
    from benchmarks.command import main as measure

    return measure(argv)


if __name__ == "__main__":
    run_cli(main)
