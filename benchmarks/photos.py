"""A folder of ImageNet-sized JPEGs made from the real photos that installed packages ship.

The loader bench needs photographs at the sizes ImageNet holds (most are 500 px on the longer side, a
minority larger), which no package ships in numbers. This cuts them from the full-size photos inside
the scikit-learn and matplotlib wheels: each file is a random region of one photo resized to one of
ImageNet's common sizes and saved as a baseline JPEG at quality 90, deterministically for a seed.
"""

from __future__ import annotations

import random
from pathlib import Path

from PIL import Image

# (width, height) of ImageNet's commonest image shapes, with roughly their share of the set
IMAGENET_SIZES = (
    ((500, 375), 40),
    ((500, 333), 20),
    ((375, 500), 10),
    ((333, 500), 5),
    ((500, 500), 5),
    ((640, 480), 10),
    ((800, 600), 5),
    ((1024, 768), 5),
)


def shipped_photos() -> list[Path]:
    """The full-size photos in the installed scikit-learn and matplotlib wheels (those present)."""
    found = []
    try:
        import sklearn

        folder = Path(sklearn.__file__).parent / "datasets" / "images"
        found += sorted(folder.glob("*.jpg"))
    except ImportError:
        pass
    try:
        import matplotlib

        found += sorted((Path(matplotlib.__file__).parent / "mpl-data" / "sample_data").glob("*.jpg"))
    except ImportError:
        pass
    return found


def make_photo_set(out: Path, count: int, classes: int = 4, seed: int = 0) -> int:
    """Write ``count`` JPEGs per split into ``out/train/<class>/`` and ``out/val/<class>/``; returns how many
    photos they were cut from (0: none installed, nothing written)."""
    photos = [Image.open(path).convert("RGB") for path in shipped_photos()]
    if not photos:
        return 0
    rng = random.Random(seed)
    sizes = [size for size, share in IMAGENET_SIZES for _ in range(share)]
    for split in ("train", "val"):
        for number in range(count):
            photo = photos[number % len(photos)]
            width, height = rng.choice(sizes)
            region = _region(photo.size, width / height, rng)
            image = photo.resize((width, height), Image.BICUBIC, box=region)
            folder = out / split / f"class{number % classes}"
            folder.mkdir(parents=True, exist_ok=True)
            image.save(folder / f"{number:05d}.jpg", quality=90)
    return len(photos)


def _region(size: tuple[int, int], aspect: float, rng: random.Random) -> tuple[float, float, float, float]:
    """A random region of at least half the photo's side with the wanted aspect ratio."""
    width, height = size
    cut_w = min(width, height * aspect) * rng.uniform(0.5, 1.0)
    cut_h = cut_w / aspect
    left = rng.uniform(0, width - cut_w)
    top = rng.uniform(0, height - cut_h)
    return (left, top, left + cut_w, top + cut_h)
