#!/usr/bin/env python3
"""Write the small Fashion-MNIST subset shipped in data/ as ImageNet-style class folders.

Source: Debian's ``dataset-fashion-mnist`` package (IDX files under
/usr/share/datasets/fashion-mnist; Zalando SE, MIT/Expat licence). The subset
is class-balanced and deterministic: the first N images of each class in
file order, training images from the training file and validation images
from the test file, so the two never overlap.
"""

from __future__ import annotations

import argparse
import gzip
import struct
from pathlib import Path

import numpy as np
from PIL import Image

CLASSES = ["t-shirt_top", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker", "bag", "ankle_boot"]
SOURCE = Path("/usr/share/datasets/fashion-mnist")


def read_idx(path: Path) -> np.ndarray:
    """Decode one gzipped IDX file (the MNIST format) into an array."""
    with gzip.open(path, "rb") as handle:
        data = handle.read()
    _, dtype_code, ndim = struct.unpack(">HBB", data[:4])
    shape = struct.unpack(f">{ndim}I", data[4 : 4 + 4 * ndim])
    assert dtype_code == 0x08, "Fashion-MNIST stores unsigned bytes"
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


def write_split(images: np.ndarray, labels: np.ndarray, per_class: int, out: Path) -> int:
    written = 0
    for class_index, name in enumerate(CLASSES):
        folder = out / name
        folder.mkdir(parents=True, exist_ok=True)
        for rank, index in enumerate(np.flatnonzero(labels == class_index)[:per_class]):
            Image.fromarray(images[index]).save(folder / f"{name}_{rank:04d}.png", optimize=True)
            written += 1
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", type=Path, default=SOURCE, help="folder with the IDX .gz files")
    parser.add_argument("--out", type=Path, default=Path("data/fashion-mnist-mini"))
    parser.add_argument("--train-per-class", type=int, default=120)
    parser.add_argument("--val-per-class", type=int, default=30)
    args = parser.parse_args()
    train = write_split(
        read_idx(args.source / "train-images-idx3-ubyte.gz"),
        read_idx(args.source / "train-labels-idx1-ubyte.gz"),
        args.train_per_class,
        args.out / "train",
    )
    val = write_split(
        read_idx(args.source / "t10k-images-idx3-ubyte.gz"),
        read_idx(args.source / "t10k-labels-idx1-ubyte.gz"),
        args.val_per_class,
        args.out / "val",
    )
    print(f"wrote {train} training and {val} validation images under {args.out}")


if __name__ == "__main__":
    main()
