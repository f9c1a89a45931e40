#!/usr/bin/env python3
"""Record Pillow 12's ``ImageOps.posterize`` for every bits value from -4 to 8, on an L and an RGB image that
hold all 256 levels in every band, into tests/data/posterize_pillow12.json.

Pillow 13 refuses fewer than 1 bit, which timm's auto-augment asks for; vtools gives Pillow 12's answer there
(vtools/data/augment_ops.py), and tests/data/test_augment_ops.py compares it with this file. Run it under Pillow 12,
kept out of the main environment:

    python3 -m pip download 'pillow<13' --no-deps -d /tmp/pillow12
    python3 -m pip install --no-deps --target /tmp/pillow12/site /tmp/pillow12/pillow-*.whl
    PYTHONPATH=/tmp/pillow12/site python3 tools/make_posterize_reference.py
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import PIL
from PIL import Image, ImageOps

OUT = Path(__file__).resolve().parent.parent / "tests/data/posterize_pillow12.json"
BITS = range(-4, 9)
SIDE = 16  # 16 x 16 pixels: each of the 256 levels once per band


def all_levels(mode: str) -> Image.Image:
    """Every level 0..255 once in each band, in a different order per band (so the bands are told apart)."""
    bands = [
        bytes((step * level + offset) % 256 for level in range(256)) for step, offset in ((1, 0), (7, 3), (3, 101))
    ]
    planes = [Image.frombytes("L", (SIDE, SIDE), band) for band in bands[: len(mode)]]
    return planes[0] if mode == "L" else Image.merge(mode, planes)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=OUT)
    args = parser.parse_args()
    if int(PIL.__version__.split(".")[0]) >= 13:
        parser.error(f"this is Pillow {PIL.__version__}; run under Pillow 12 or earlier (see the docstring)")
    record = {"pillow": PIL.__version__, "size": [SIDE, SIDE], "images": {}, "posterize": {}}
    for mode in ("L", "RGB"):
        image = all_levels(mode)
        record["images"][mode] = image.tobytes().hex()
        record["posterize"][mode] = {str(bits): ImageOps.posterize(image, bits).tobytes().hex() for bits in BITS}
    args.output.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {args.output} (Pillow {PIL.__version__}, bits {BITS.start}..{BITS.stop - 1}, L and RGB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
