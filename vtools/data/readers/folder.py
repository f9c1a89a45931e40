"""Class folders (``root/<split>/<class>/<image>``), image lists and class maps.

Labels come from sorted folder names, a ``--class-map`` file, or ImageNet synsets
when the folders are named as timm names them; a split is found under its
common aliases (``validation``, ``val``, ...).
"""

from __future__ import annotations

import glob
import os
from collections.abc import Sequence
from pathlib import Path

from timm.data import ImageNetInfo

from vtools.data.decode import IMAGE_EXTENSIONS
from vtools.errors import UsageError


def is_image(path: Path) -> bool:
    """An image by its extension; macOS's ``._name`` resource forks (copied along by archivers) are not."""
    return path.suffix.lower() in IMAGE_EXTENSIONS and not path.name.startswith("._")


def find_images(source: str) -> list[Path]:
    """Images named by a folder (searched recursively), a glob, a text file of paths, or one image."""
    path = Path(source).expanduser()
    if any(ch in source for ch in "*?["):
        found = [Path(p) for p in sorted(glob.glob(source, recursive=True)) if is_image(Path(p))]
        what = f"the pattern {source!r}"
    elif path.is_dir():
        found = sorted(p for p in path.rglob("*") if p.is_file() and is_image(p))
        what = f"the folder {path}"
    elif path.is_file() and path.suffix.lower() == ".txt":
        lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        found = [(path.parent / line) if not Path(line).is_absolute() else Path(line) for line in lines]
        missing = [str(p) for p in found if not p.is_file()]
        if missing:
            raise UsageError(f"{path} lists {len(missing)} missing file(s), e.g. {missing[0]}")
        what = f"the list {path}"
    elif path.is_file():
        found, what = [path], str(path)
    else:
        raise UsageError(f"{source} does not exist")
    if not found:
        raise UsageError(f"no images found in {what} (looked for {', '.join(IMAGE_EXTENSIONS)})")
    return found


def find_class_folders(root: Path) -> list[str]:
    """Class folder names of an ImageNet-style split, sorted as torchvision does."""
    if not root.is_dir():
        raise UsageError(f"{root} does not exist or is not a folder")
    classes = sorted(entry.name for entry in os.scandir(root) if entry.is_dir() and not entry.name.startswith("."))
    if not classes:
        raise UsageError(f"{root} has no class folders (expected one folder per class)")
    return classes


def read_class_map(path: str | os.PathLike) -> dict[str, int]:
    """timm's --class-map: a text file with one class name per line, line number = index."""
    file = Path(path)
    if not file.is_file():
        raise UsageError(f"--class-map {path} does not exist")
    names = [line.strip() for line in file.read_text(encoding="utf-8").splitlines() if line.strip()]
    return {name.split()[0]: index for index, name in enumerate(names)}


def imagenet_class_map(classes: Sequence[str], num_classes: int | None) -> dict[str, int] | None:
    """Map synset folders (n01440764 ...) to ImageNet-1k indices when the model has 1000 outputs."""
    if num_classes != 1000:
        return None
    synsets = ImageNetInfo().label_names()
    index = {name: i for i, name in enumerate(synsets)}
    if classes and all(name in index for name in classes):
        return {name: index[name] for name in classes}
    return None


def labelled_files(root: Path, class_map: dict[str, int] | None = None) -> tuple[list[Path], list[int], list[str]]:
    """All images under ``root/<class>/`` with their labels, and the class names by label."""
    classes = find_class_folders(root)
    if class_map is None:
        class_map = {name: index for index, name in enumerate(classes)}
    unknown = [name for name in classes if name not in class_map]
    if unknown:
        raise UsageError(f"class folder(s) {', '.join(unknown[:3])} under {root} are not in the class map")
    paths, labels = [], []
    for name in classes:
        for file in sorted(p for p in (root / name).rglob("*") if p.is_file() and is_image(p)):
            paths.append(file)
            labels.append(class_map[name])
    if not paths:
        raise UsageError(f"no images found in the class folders under {root}")
    names_by_label = sorted(class_map, key=class_map.get)
    return paths, labels, names_by_label


SPLIT_ALIASES = {"validation": ("validation", "val", "eval", "evaluation", "valid"), "train": ("train", "training")}


def resolve_split_dir(root: str | os.PathLike, split: str) -> Path:
    """``root/<split>`` (or a usual alias of it) when present, else ``root`` itself."""
    base = Path(root).expanduser()
    if not base.exists():
        raise UsageError(f"{base} does not exist")
    for name in SPLIT_ALIASES.get(split, (split,)):
        if (base / name).is_dir():
            return base / name
    return base


def eval_class_map(
    classes: Sequence[str], class_map_file: str | None, num_classes: int | None, model_class_names: Sequence[str] | None
) -> tuple[dict[str, int] | None, str]:
    """How folder names become label indices, and a line saying which way was taken: --class-map, the
    model's own class names (matched ignoring case), ImageNet synsets, or (None) sorted folder order.

    A partial match would give meaningless numbers, so it is refused unless --class-map says how.
    """
    if class_map_file:
        return read_class_map(class_map_file), f"labels from --class-map {class_map_file}"
    if model_class_names:
        index = {name.lower(): i for i, name in enumerate(model_class_names)}
        unknown = [name for name in classes if name.lower() not in index]
        if unknown:
            raise UsageError(
                f"{len(unknown)} of {len(classes)} class folders ({', '.join(unknown[:3])}) are not "
                f"among the model's class names ({', '.join(list(model_class_names)[:5])}...); "
                "pass --class-map to say which output each folder is"
            )
        return {name: index[name.lower()] for name in classes}, "labels matched to the model's class names"
    mapping = imagenet_class_map(classes, num_classes)
    if mapping is not None:
        return mapping, "labels are the ImageNet-1k indices of the synset folders"
    synsets = set(ImageNetInfo().label_names()) if num_classes == 1000 else set()
    if synsets and any(name in synsets for name in classes):
        raise UsageError("some class folders are ImageNet synsets and some are not; pass --class-map")
    return None, "labels by sorted folder order (the model stores no class names)"
