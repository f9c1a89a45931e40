"""Writing an image folder as WebDataset tar shards or a Hugging Face parquet copy, atomically.

Shards follow the layout timm reads (``<key>.jpg``/``.png``, ``<key>.cls``,
``<key>.json``) with timm's split-info file (``_info.json``) and the class names,
so the readers need no further flags. A multi-label folder (a split with
``labels.csv`` or ``labels.json``) keeps its labels: each ``.cls`` holds the
image's class list (``[1, 3]``, ``[]`` for none; a list even of one, so the
split reads back as multi-label) and parquet gets a list-of-ClassLabel column. ``max_side`` re-encodes images with their
longer side bounded (PNG stays PNG, the rest become JPEG): decoding full-size
JPEGs is what limits a fast accelerator.
"""

from __future__ import annotations

import io
import json
import os
import shutil
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from PIL import Image

from vtools.data.readers.folder import labelled_images, resolve_split_dir
from vtools.data.readers.label_file import find_label_file, read_label_file
from vtools.errors import UsageError
from vtools.progress import progress

SPLIT_NAMES = ("train", "validation", "test")


def _splits(source: Path, split: str | None) -> dict[str, Path]:
    """The split folders under ``source`` (train/validation/test and their usual aliases), or
    ``source`` itself as one split."""
    if split:
        return {split: source}
    found = {}
    for name in SPLIT_NAMES:
        folder = resolve_split_dir(source, name)
        if folder != source:
            found[name] = folder
    return found or {"train": source}


def _encoded(path: str, max_side: int | None) -> tuple[bytes, str]:
    """The image's bytes and extension, re-encoded only when it is larger than ``max_side``."""
    extension = Path(path).suffix.lower().lstrip(".")
    extension = "jpg" if extension == "jpeg" else extension
    if not max_side:
        return Path(path).read_bytes(), extension
    with Image.open(path) as img:
        img.load()
        if max(img.size) <= max_side:
            return Path(path).read_bytes(), extension
        scale = max_side / max(img.size)
        resized = img.resize(
            (max(1, round(img.width * scale)), max(1, round(img.height * scale))), Image.Resampling.BICUBIC
        )
    buffer = io.BytesIO()
    if extension == "png":
        resized.save(buffer, format="PNG")
        return buffer.getvalue(), "png"
    resized.convert("RGB" if resized.mode not in ("L", "RGB") else resized.mode).save(buffer, format="JPEG", quality=90)
    return buffer.getvalue(), "jpg"


def _encode_job(job: tuple[str, int | None]) -> tuple[bytes, str] | str:
    try:
        return _encoded(*job)
    except (OSError, ValueError, Image.DecompressionBombError) as err:
        return f"{job[0]}: cannot read image ({type(err).__name__}: {err})".splitlines()[0]


def _encoded_all(paths: list[str], max_side: int | None, workers: int) -> Iterator[tuple[bytes, str]]:
    jobs = [(p, max_side) for p in paths]
    if max_side and workers > 1:
        with ProcessPoolExecutor(workers) as pool:
            results: Iterator = pool.map(_encode_job, jobs, chunksize=64)
            yield from _checked(results)
    else:
        yield from _checked(map(_encode_job, jobs))


def _checked(results: Iterator[tuple[bytes, str] | str]) -> Iterator[tuple[bytes, str]]:
    for result in results:
        if isinstance(result, str):
            raise UsageError(result)
        yield result


Labels = list[int] | list[list[int]]  # one class per image, or each image's classes (multi-label)


def _split_samples(folder: Path, class_map: dict[str, int], multi_label: bool, first: Path) -> tuple[list[str], Labels]:
    """A split's image paths and labels, read as the readers read it: from its labels file, or its class
    folders; every split of one output is of one kind."""
    label_file = find_label_file(folder)
    if (label_file is not None) != multi_label:
        kind = "a labels file (multi-label)" if multi_label else "class folders"
        raise UsageError(f"{folder} and {first} differ: {first} has {kind}, so every split must; convert them apart")
    if label_file is not None:
        samples, _ = read_label_file(label_file, class_map)
        sets = samples.label_sets
        return list(samples.paths), [sets.classes_of(index).tolist() for index in range(len(sets))]
    found = labelled_images(folder, class_map)
    if found.entries.unreadable:  # never opened: a FIFO would block the reader
        index, reason = min(found.entries.unreadable.items())
        raise UsageError(f"{found.entries.paths[index]}: cannot read image ({reason}); fix or remove it")
    return list(found.entries.paths), found.labels.tolist()


def _label_members(label: int | list[int], classes: list[str]) -> tuple[bytes, object, object]:
    """A sample's ``.cls`` text and its JSON label and class name(s)."""
    if isinstance(label, list):
        return json.dumps(label).encode(), label, [classes[i] for i in label]
    return str(label).encode(), label, classes[label]


def _write_tar_split(
    out: Path,
    name: str,
    split: str,
    paths: list[str],
    labels: Labels,
    classes: list[str],
    root: Path,
    shard_size: int,
    max_side: int | None,
    workers: int,
) -> dict:
    from webdataset import TarWriter  # the field's shard writer

    filenames, lengths = [], []
    writer = None
    encoded = _encoded_all(paths, max_side, workers)
    bar = progress(zip(paths, labels, encoded), f"{split} shards", total=len(paths))
    bar.unit = "img"
    for index, (path, label, (data, extension)) in enumerate(bar):
        if index % shard_size == 0:
            if writer is not None:
                writer.close()
            filenames.append(f"{name}-{split}-{len(filenames):06d}.tar")
            lengths.append(0)
            writer = TarWriter(str(out / filenames[-1]))
        cls, json_label, class_name = _label_members(label, classes)
        meta = {"filename": os.path.relpath(path, root), "label": json_label, "class_name": class_name}
        writer.write({"__key__": f"{index:09d}", extension: data, "cls": cls, "json": json.dumps(meta).encode()})
        lengths[-1] += 1
    if writer is not None:
        writer.close()
    return {"name": split, "num_samples": len(paths), "filenames": filenames, "shard_lengths": lengths}


def _write_parquet_split(
    out: Path, split: str, paths: list[str], labels: Labels, classes: list[str], max_side: int | None, workers: int
) -> None:
    from vtools.data.readers.hfds import datasets_module

    datasets = datasets_module("--format parquet")
    label = datasets.ClassLabel(names=classes)
    multi_label = bool(labels) and isinstance(labels[0], list)
    features = datasets.Features(
        {"image": datasets.Image(), "label": datasets.Sequence(label) if multi_label else label}
    )
    images = [
        {"bytes": data, "path": os.path.basename(path)}
        for path, (data, _) in zip(
            paths, progress(_encoded_all(paths, max_side, workers), f"{split} rows", total=len(paths))
        )
    ]
    table = datasets.Dataset.from_dict({"image": images, "label": labels}, features=features)
    (out / "data").mkdir(exist_ok=True)
    table.to_parquet(str(out / "data" / f"{split}-00000-of-00001.parquet"))


def convert(
    source: Path,
    out: Path,
    name: str,
    fmt: str = "wds",
    shard_size: int = 1000,
    max_side: int | None = None,
    split: str | None = None,
    workers: int = 1,
) -> dict:
    """Write every split of ``source`` into ``out`` (built beside it, renamed when complete)."""
    if not source.is_dir():
        raise UsageError(f"{source}: the image folder does not exist")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f"{out} already exists and is not empty: choose another output folder")
    splits = _splits(source, split)
    first = next(iter(splits.values()))
    first_labels = find_label_file(first)
    multi_label = first_labels is not None
    classes = read_label_file(first_labels)[1] if first_labels is not None else labelled_images(first).classes
    class_map = {c: i for i, c in enumerate(classes)}
    partial = out.with_name(f".{out.name}.partial-{os.getpid()}")
    partial.mkdir(parents=True)
    try:
        info = {"name": name, "classes": classes, "multi_label": multi_label, "splits": {}}
        for split_name, folder in splits.items():
            paths, labels = _split_samples(folder, class_map, multi_label, first)
            if fmt == "wds":
                info["splits"][split_name] = _write_tar_split(
                    partial, name, split_name, paths, labels, classes, folder, shard_size, max_side, workers
                )
            else:
                _write_parquet_split(partial, split_name, paths, labels, classes, max_side, workers)
                info["splits"][split_name] = {"name": split_name, "num_samples": len(paths)}
        if fmt == "wds":
            (partial / "_info.json").write_text(json.dumps(info, indent=1), encoding="utf-8")
        if out.exists():
            out.rmdir()
        partial.rename(out)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return info
