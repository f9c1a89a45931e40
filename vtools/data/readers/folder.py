"""Class folders (``root/<split>/<class>/<image>``), image lists and class maps.

Labels come from sorted folder names, a ``--class-map`` file, or ImageNet synsets
when the folders are named as timm names them; a split is found under its
common aliases (``validation``, ``val``, ...).
"""

from __future__ import annotations

import glob
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from timm.data import ImageNetInfo

from vtools.data.decode import IMAGE_EXTENSIONS, not_a_file_reason
from vtools.data.readers.path_table import PathTable
from vtools.data.readers.scan import EntryList, ImageEntries, has_image_entries, is_image_name, scan_folder
from vtools.data.readers.split_scan import scan_split
from vtools.errors import UsageError


def find_images(source: str) -> list[Path]:
    """Images named by a folder (searched recursively), a glob, a text file of paths, or one image; an
    entry that cannot be read is among them (:func:`find_image_entries` says which and why)."""
    return [Path(path) for path in find_image_entries(source).paths]


def find_image_entries(source: str) -> ImageEntries:
    """The images of a folder (searched recursively), a glob, a text file of paths, or one image, with
    the reason each entry known to be unreadable (a dangling link, a folder that cannot be listed, a
    listed file that is missing) cannot be read: --on-bad-image decides about those as about a corrupt
    file. A glob's matches are not stat'ed: an unreadable one is found when it is read."""
    path = Path(source).expanduser()
    if any(ch in source for ch in "*?["):
        matches = [p for p in sorted(glob.glob(source, recursive=True)) if is_image_name(os.path.basename(p))]
        found = ImageEntries(PathTable.of(matches))
        what = f"the pattern {source!r}"
    elif path.is_dir():
        found, what = scan_folder(path), f"the folder {path}"
    elif path.is_file() and path.suffix.lower() == ".txt":
        found, what = _listed_images(path), f"the list {path}"
    elif path.is_file():
        found, what = ImageEntries(PathTable.of([path])), str(path)
    else:
        raise UsageError(f"{source} does not exist")
    if not found.paths:
        raise UsageError(f"no images found in {what} (looked for {', '.join(IMAGE_EXTENSIONS)})")
    return found


def _listed_images(listing: Path) -> ImageEntries:
    """The paths a text file lists (relative ones from its folder); a missing one is an unreadable entry."""
    found = EntryList()
    for line in listing.read_text(encoding="utf-8").splitlines():
        if line.strip():
            listed = Path(line.strip())
            file = listed if listed.is_absolute() else listing.parent / listed
            found.add(str(file), None if file.is_file() else f"listed in {listing}, but {not_a_file_reason(file)}")
    return found.packed()


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


@dataclass
class LabelledImages:
    """The image entries of a split's class folders (unreadable ones with their reasons), each one's
    label (an int32 array: 4 bytes an image, shared by forked loader workers), and the class names by
    label."""

    entries: ImageEntries
    labels: np.ndarray
    classes: list[str]


def labelled_images(root: Path, class_map: dict[str, int] | None = None, check_empty: bool = True) -> LabelledImages:
    """Every image entry under ``root/<class>/`` with its label. Without ``class_map`` labels follow the
    sorted folder names, where an empty class folder would silently be a class (shifting the labels
    after it): it is refused. With one (labels matched by name) an empty folder changes nothing: a
    warning says so. ``check_empty=False`` leaves that to a later call that knows which applies."""
    scan = scan_split(root)
    classes = scan.classes
    by_name = class_map is not None
    if class_map is None:
        class_map = {name: index for index, name in enumerate(classes)}
    empty = [name for name, count in zip(classes, scan.counts) if not count]
    unknown = [name for name in classes if name not in class_map and name not in empty]  # empty: no labels needed
    if unknown:
        raise UsageError(f"class folder(s) {', '.join(unknown[:3])} under {root} are not in the class map")
    if not scan.counts or not sum(scan.counts):
        raise UsageError(f"no images found in the class folders under {root}")
    if empty and check_empty:
        _empty_class_folders(root, empty, by_name)
    labels = np.repeat(np.array([class_map.get(name, -1) for name in classes], dtype=np.int32), scan.counts)
    return LabelledImages(scan.entries, labels, sorted(class_map, key=class_map.get))


def _empty_class_folders(root: Path, empty: list[str], by_name: bool) -> None:
    more = f" and {len(empty) - 3} more" if len(empty) > 3 else ""
    named = f"empty class folder{'s' if len(empty) > 1 else ''} {', '.join(str(root / n) for n in empty[:3])}{more}"
    if by_name:
        print(f"warning: {named}: labels are matched by class name, so this changes nothing", file=sys.stderr)
        return
    raise UsageError(
        f"{named}: labels come from the sorted folder names, so an empty folder would still count as a class "
        "and shift the labels of the folders after it; add images to it or remove it"
    )


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
    classes: Sequence[str],
    class_map_file: str | None,
    num_classes: int | None,
    model_class_names: Sequence[str] | None,
    root: Path | None = None,
) -> tuple[dict[str, int] | None, str]:
    """How folder names become label indices, and a line saying which way was taken: --class-map, the
    model's own class names (matched ignoring case), ImageNet synsets, or (None) sorted folder order.

    A partial match would give meaningless numbers, so it is refused unless --class-map says how; an
    empty folder under ``root`` needs no label, so its name need not match.
    """
    if class_map_file:
        return read_class_map(class_map_file), f"labels from --class-map {class_map_file}"
    if model_class_names:
        index = {name.lower(): i for i, name in enumerate(model_class_names)}
        unknown = [name for name in classes if name.lower() not in index]
        unknown = [name for name in unknown if root is None or has_image_entries(root / name)]  # empty: no labels
        if unknown:
            raise UsageError(
                f"{len(unknown)} of {len(classes)} class folders ({', '.join(unknown[:3])}) are not "
                f"among the model's class names ({', '.join(list(model_class_names)[:5])}...); "
                "pass --class-map to say which output each folder is"
            )
        matched = {name: index[name.lower()] for name in classes if name.lower() in index}
        return matched, "labels matched to the model's class names"
    mapping = imagenet_class_map(classes, num_classes)
    if mapping is not None:
        return mapping, "labels are the ImageNet-1k indices of the synset folders"
    synsets = set(ImageNetInfo().label_names()) if num_classes == 1000 else set()
    if synsets and any(name in synsets for name in classes):
        raise UsageError("some class folders are ImageNet synsets and some are not; pass --class-map")
    return None, "labels by sorted folder order (the model stores no class names)"
