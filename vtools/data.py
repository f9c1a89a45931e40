"""Datasets and loaders: decode on CPU workers, ship uint8, normalize on the device.

Workers return uint8 tensors (4x smaller than float32 to pin and copy);
:class:`DeviceLoader` moves each batch to the device, converts and
normalizes it there, and prefetches the next batch on a side stream where
the backend has streams. Preprocessing itself is timm's
(``resolve_data_config`` + ``create_transform``), so numbers match timm's
scripts. Unreadable images never raise inside a worker: they travel to the
main process as :class:`BadSample` so the error is one clear line (or a
counted skip).
"""

from __future__ import annotations

import atexit
import glob
import io
import multiprocessing
import multiprocessing.util  # noqa: F401  (its exit handler must be registered before ours)
import os
import signal
import sys
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
import torchvision
from PIL import Image, UnidentifiedImageError
from timm.data import ImageNetInfo, create_transform, resolve_data_config
from torch.utils.data import DataLoader, Dataset, Sampler

from vtools import device as dev
from vtools.host import plan, usable_cores
from vtools.errors import UsageError

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff", ".gif", ".ppm", ".pgm")
ON_BAD_IMAGE = ("error", "skip")

# torchvision datasets reachable as --dataset torch/<name>: class and how it names its splits
_TORCH_DATASETS: dict[str, tuple[str, str]] = {
    "cifar10": ("CIFAR10", "train_flag"), "cifar100": ("CIFAR100", "train_flag"),
    "mnist": ("MNIST", "train_flag"), "fashion_mnist": ("FashionMNIST", "train_flag"),
    "kmnist": ("KMNIST", "train_flag"), "qmnist": ("QMNIST", "train_flag"),
    "svhn": ("SVHN", "split_test"), "stl10": ("STL10", "split_test"), "food101": ("Food101", "split_test"),
    "flowers102": ("Flowers102", "split_val"), "dtd": ("DTD", "split_val"), "imagenet": ("ImageNet", "split_val"),
}


@dataclass(frozen=True)
class BadSample:
    """An image that could not be decoded, carried to the main process instead of an exception.

    ``replaced`` marks one that training swapped for another readable image, so
    that batches keep the size the recipe assumes.
    """

    path: str
    reason: str
    replaced: bool = False


def open_image(source: str | os.PathLike | bytes, mode: str, name: str | None = None) -> Image.Image | BadSample:
    """Decode an image (a file, or the bytes of one read from a shard or a table) fully, so truncation
    is caught here, or describe why not. A decompression bomb (more pixels than PIL's limit) is a bad
    image, and so is a float image, which has no 8-bit meaning; 16-bit images are scaled to 8 bits
    rather than clipped."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(source) if isinstance(source, bytes) else source) as img:
                img.load()
                return _to_8_bit(img).convert(mode)
    except (OSError, UnidentifiedImageError, ValueError, SyntaxError, Image.DecompressionBombError,
            Image.DecompressionBombWarning) as err:
        return BadSample(name or str(source), f"{type(err).__name__}: {err}".splitlines()[0])


def _to_8_bit(img: Image.Image) -> Image.Image:
    """PIL's convert() clips 16-bit values at 255; scale them instead. Float images are refused."""
    if img.mode in ("I;16", "I;16L", "I;16B", "I;16N", "I"):
        values = np.asarray(img, dtype=np.float64)
        top = 65535.0 if img.mode.startswith("I;16") else max(float(values.max()), 1.0)
        return Image.fromarray(np.round(values * (255.0 / top)).clip(0, 255).astype(np.uint8), mode="L")
    if img.mode == "F":
        raise ValueError(f"{img.mode}-mode (floating-point) images have no 8-bit meaning; convert them to "
                         "8 or 16 bits first")
    return img


@dataclass(frozen=True)
class RawSample:
    """One stored sample before decoding: a file path or the image's bytes, its label (-1 when
    unlabelled), and the name that messages and results use for it."""

    image: str | bytes
    label: int
    name: str


class SampleStore(Protocol):
    """Random access to raw samples; what every data source (folders, shards, tables) provides."""

    def __len__(self) -> int: ...

    def locate(self, index: int) -> RawSample | BadSample: ...

    def name(self, index: int) -> str: ...


class FileSamples:
    """Image files with their labels."""

    def __init__(self, paths: Sequence[str | os.PathLike], labels: Sequence[int] | None = None) -> None:
        self.paths = [str(p) for p in paths]
        self.labels = list(labels) if labels is not None else [-1] * len(self.paths)

    def __len__(self) -> int:
        return len(self.paths)

    def locate(self, index: int) -> RawSample:
        return RawSample(self.paths[index], self.labels[index], self.paths[index])

    def name(self, index: int) -> str:
        return self.paths[index]


class DecodedImages(Dataset):
    """Decoded, transformed ``(image, label, index)`` items from any :class:`SampleStore`; an image that
    cannot be read comes through as a :class:`BadSample` for the main process to report or skip.

    With ``keep_bytes``, each process keeps the images it decoded (before the random transform) while
    they fit in that many bytes, and later epochs transform the kept image instead of reading and
    decoding the file again. A set that does not fit is not kept at all: random access would hit a
    partial store too rarely to pay for its memory.
    """

    def __init__(self, samples: SampleStore, transform: Callable, mode: str, keep_bytes: int = 0) -> None:
        self.samples = samples
        self.transform = transform
        self.mode = mode
        self.keep_bytes = keep_bytes
        self._kept: dict[int, tuple[Image.Image, int]] = {}
        self._kept_bytes = 0

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[Any, int, int]:
        if index in self._kept:
            image, label = self._kept[index]
            return self.transform(image), label, index
        raw = self.samples.locate(index)
        if isinstance(raw, BadSample):
            return raw, -1, index
        image = open_image(raw.image, self.mode, raw.name)
        if isinstance(image, BadSample):
            return image, raw.label, index
        self._keep(index, image, raw.label)
        return self.transform(image), raw.label, index

    def _keep(self, index: int, image: Image.Image, label: int) -> None:
        if not self.keep_bytes:
            return
        self._kept_bytes += image.width * image.height * len(image.getbands()) + _IMAGE_OVERHEAD_BYTES
        if self._kept_bytes > self.keep_bytes:  # the set does not fit: keep nothing
            self.keep_bytes, self._kept = 0, {}
            return
        self._kept[index] = (image, label)


_IMAGE_OVERHEAD_BYTES = 1024  # a PIL image's objects besides its pixels, roughly


class ImageFiles(DecodedImages):
    """Images from a list of paths, each with a label (-1 when unlabelled)."""

    def __init__(self, paths: Sequence[str], labels: Sequence[int] | None, transform: Callable, mode: str) -> None:
        super().__init__(FileSamples(paths, labels), transform, mode)


class TorchvisionImages(Dataset):
    """A torchvision dataset, with the same (image, label, index) items as :class:`ImageFiles`."""

    def __init__(self, dataset: Dataset, transform: Callable, mode: str) -> None:
        self.dataset = dataset
        self.transform = transform
        self.mode = mode

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> tuple[Any, int, int]:
        image, label = self.dataset[index]
        if isinstance(image, torch.Tensor):
            image = torchvision.transforms.functional.to_pil_image(image)
        return self.transform(image.convert(self.mode)), int(label), index


@dataclass
class Batch:
    """A collated batch: uint8 images, labels, dataset indices, and any images that failed."""

    images: torch.Tensor
    targets: torch.Tensor
    indices: torch.Tensor
    bad: list[BadSample] = field(default_factory=list)

    def pin_memory(self) -> "Batch":
        """Called by DataLoader's pin-memory thread."""
        return Batch(self.images.pin_memory(), self.targets.pin_memory(), self.indices, self.bad)


def collate(items: list[tuple[Any, ...]]) -> Batch:
    """Stack decoded samples; set bad ones aside. An item may carry a fourth element: the bad
    images it replaces."""
    good = [item for item in items if not isinstance(item[0], BadSample)]
    bad = [item[0] for item in items if isinstance(item[0], BadSample)]
    bad += [record for item in items if len(item) > 3 for record in item[3]]
    if good:
        images = torch.stack([torch.as_tensor(item[0]) for item in good])
    else:
        images = torch.empty(0, dtype=torch.uint8)
    targets = torch.tensor([item[1] for item in good], dtype=torch.int64)
    indices = torch.tensor([item[2] for item in good], dtype=torch.int64)
    return Batch(images, targets, indices, bad)


# ---------------------------------------------------------------- finding images


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


def torchvision_dataset(name: str, root: str, split: str, download: bool) -> Dataset:
    """``torch/<name>`` as a torchvision dataset rooted at ``root``."""
    key = name.removeprefix("torch/").lower()
    if key not in _TORCH_DATASETS:
        raise UsageError(f"--dataset {name}: unknown torchvision dataset (known: "
                         f"{', '.join('torch/' + k for k in _TORCH_DATASETS)})")
    class_name, split_style = _TORCH_DATASETS[key]
    is_train = split.startswith("train")
    kwargs: dict[str, Any]
    if split_style == "train_flag":
        kwargs = {"train": is_train}
    else:
        eval_name = split_style.split("_")[1]
        kwargs = {"split": "train" if is_train else eval_name}
    if download and class_name != "ImageNet":
        kwargs["download"] = True
    try:
        return getattr(torchvision.datasets, class_name)(root, **kwargs)
    except RuntimeError as err:
        hint = "" if download else " (add --dataset-download to fetch it)"
        raise UsageError(f"--dataset {name}: {str(err).splitlines()[0]}{hint}") from err
    except OSError as err:
        raise UsageError(f"--dataset {name}: could not read or download it into {root} ({err})") from err


# ---------------------------------------------------------------- transforms and loaders


def data_config_for(model: torch.nn.Module, overrides: dict[str, Any]) -> dict[str, Any]:
    """timm's data config for ``model`` with command-line overrides (img_size, crop_pct, mean...)."""
    args = {k: v for k, v in overrides.items() if v is not None}
    config = resolve_data_config(args=args, model=model)
    channels = args["input_size"][0] if "input_size" in args else args.get("in_chans", config["input_size"][0])
    config["input_size"] = (channels, *config["input_size"][1:])
    config["mean"] = _per_channel(config["mean"], channels)
    config["std"] = _per_channel(config["std"], channels)
    return config


def _per_channel(values: Sequence[float], channels: int) -> tuple[float, ...]:
    """Normalization constants for ``channels`` inputs (a 3-channel mean averaged for grayscale)."""
    values = tuple(values)
    if len(values) == channels:
        return values
    if len(values) == 1:
        return values * channels
    return (sum(values) / len(values),) * channels


def eval_transform(data_config: dict[str, Any]) -> Callable:
    """timm's evaluation preprocessing, ending in uint8 tensors (normalization is on the device)."""
    return create_transform(**data_config, is_training=False, use_prefetcher=True)


def image_mode(data_config: dict[str, Any]) -> str:
    return "L" if data_config["input_size"][0] == 1 else "RGB"


def leave_signals_to_main(worker_id: int) -> None:
    """Loader workers ignore SIGINT/SIGTERM: a batch scheduler signals the whole process group, and the
    main process must live to save a checkpoint (a worker dying first would crash it instead). Workers
    still end with the main process."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _kill_loader_workers_at_exit() -> None:
    """Stop daemonic children (loader workers) with SIGKILL when the main process exits.

    multiprocessing's own exit handler sends them SIGTERM and then waits; ours
    ignore SIGTERM (leave_signals_to_main), so a run that ends while its workers
    are still up (a failure mid-epoch) would wait forever. atexit runs handlers
    last-in first-out, so this one runs before multiprocessing's. torch's SIGCHLD
    handler would report these deaths as failed workers, so it is reset first.
    """
    children = [child for child in multiprocessing.active_children() if child.daemon]
    if children and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for child in children:
        child.kill()


atexit.register(_kill_loader_workers_at_exit)


def make_loader(dataset: Dataset, batch_size: int, device: torch.device, workers: int | None = None,
                sampler: Sampler | None = None, drop_last: bool = False,
                persistent: bool = True, seed: int = 0) -> DataLoader:
    """A DataLoader with device-aware pinning and persistent workers; order comes from ``sampler``
    (training passes a seeded one), else the dataset's own order.

    The loader gets a generator of its own: each new iterator draws a worker seed
    from it, and drawn from the global RNG that would shift the dropout and mixup
    streams of a resumed run, whose first validation comes at another moment.
    """
    workers = plan(device.type, len(usable_cores())).workers if workers is None else workers
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, worker_init_fn=leave_signals_to_main,
                      num_workers=workers, collate_fn=collate, pin_memory=dev.pin_memory(device),
                      drop_last=drop_last, persistent_workers=persistent and workers > 0,
                      prefetch_factor=4 if workers > 0 else None, generator=torch.Generator().manual_seed(seed))


class DeviceLoader:
    """Iterate a loader's batches already on the device, as normalized float tensors.

    While the model works on batch N, batch N+1 is copied (non_blocking from
    pinned memory) and normalized on a side stream where the backend has one.
    """

    def __init__(self, loader: DataLoader | KeptBatches, device: torch.device, mean: Sequence[float],
                 std: Sequence[float], channels_last: bool = False,
                 batch_transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
                 on_bad: Callable[[list[BadSample]], None] | None = None) -> None:
        self.loader = loader
        self.device = device
        shape = (1, len(mean), 1, 1)
        self.mean = torch.tensor(mean, dtype=torch.float32).view(shape).to(device)
        self.std = torch.tensor(std, dtype=torch.float32).view(shape).to(device)
        self.channels_last = channels_last
        self.batch_transform = batch_transform
        self.on_bad = on_bad
        self.non_blocking = dev.non_blocking(device)
        self.stream = dev.new_stream(device)
        self._started: Iterator[Batch] | None = None

    def __len__(self) -> int:
        return len(self.loader)

    @property
    def started(self) -> bool:
        return self._started is not None

    def start(self) -> None:
        """Have the workers start decoding the next pass now (its order must be set already), so its
        first batches are ready when it begins instead of costing a wait at every epoch's start."""
        if self._started is None:
            self._started = iter(self.loader)

    @property
    def dataset(self) -> Dataset:
        return self.loader.dataset

    def _to_device(self, batch: Batch) -> Batch:
        images = batch.images.to(self.device, non_blocking=self.non_blocking)
        targets = batch.targets.to(self.device, non_blocking=self.non_blocking)
        if images.numel():
            images = images.float().div_(255).sub_(self.mean).div_(self.std)
            if self.channels_last:
                images = images.contiguous(memory_format=torch.channels_last)
            if self.batch_transform is not None:
                images = self.batch_transform(images)
        return Batch(images, targets, batch.indices, batch.bad)

    def _prepare(self, batch: Batch) -> Batch:
        if self.on_bad is not None and batch.bad:
            self.on_bad(batch.bad)
        with dev.on_stream(self.device, self.stream):
            return self._to_device(batch)

    def __iter__(self) -> Iterator[Batch]:
        batches, self._started = self._started or iter(self.loader), None
        if self.stream is None:  # nothing to overlap with: preparing the next batch early would only make
            for batch in batches:  # each step wait for one more batch from the workers
                yield self._prepare(batch)
            return
        upcoming: Batch | None = None
        for batch in batches:
            prepared = self._prepare(batch)
            if upcoming is not None:
                yield upcoming
            dev.wait_stream(self.device, self.stream, (prepared.images, prepared.targets))
            upcoming = prepared
        if upcoming is not None:
            yield upcoming


# train.py keeps a training set's decoded images (split among its loader processes) and a validation
# set's batches in host memory when they fit in these sizes
KEEP_TRAINING_BYTES = 512 << 20
KEEP_VALIDATION_BYTES = 512 << 20


class KeptBatches:
    """A loader whose first complete pass is kept in host memory when its images fit in ``limit_bytes``;
    later passes replay it without decoding.

    train.py validates on the same images every epoch, and with eval transforms they decode to the
    same uint8 batches each time: for a small set (CIFAR-sized, or the shipped data) that decoding
    is work the workers would repeat on cores the model needs. A pass that stops early keeps nothing.
    """

    def __init__(self, loader: DataLoader, limit_bytes: int) -> None:
        self.loader = loader
        self.limit_bytes = limit_bytes
        self.kept: list[Batch] | None = None

    def __len__(self) -> int:
        return len(self.loader)

    @property
    def dataset(self) -> Dataset:
        return self.loader.dataset

    def __iter__(self) -> Iterator[Batch]:
        if self.kept is not None:
            return iter(self.kept)
        return self._keeping(iter(self.loader))  # iter() here: the workers start now, not at the first batch

    def _keeping(self, batches: Iterator[Batch]) -> Iterator[Batch]:
        kept: list[Batch] | None = []
        size = 0
        for batch in batches:
            size += batch.images.nbytes
            if kept is not None and size <= self.limit_bytes and batch.images.dtype == torch.uint8:
                kept.append(batch if self.loader.pin_memory else _own_copy(batch))
            else:
                kept = None
            yield batch
        self.kept = kept


def _own_copy(batch: Batch) -> Batch:
    """A batch in this process's memory: one from a worker lives in shared memory, and holding many of
    those would hold as many shared segments (and file descriptors) open. A pinned batch was copied by
    the main process already."""
    return Batch(batch.images.clone(), batch.targets.clone(), batch.indices.clone(), batch.bad)


SPLIT_ALIASES = {"validation": ("validation", "val", "eval", "evaluation", "valid"),
                 "train": ("train", "training")}


def resolve_split_dir(root: str | os.PathLike, split: str) -> Path:
    """``root/<split>`` (or a usual alias of it) when present, else ``root`` itself."""
    base = Path(root).expanduser()
    if not base.exists():
        raise UsageError(f"{base} does not exist")
    for name in SPLIT_ALIASES.get(split, (split,)):
        if (base / name).is_dir():
            return base / name
    return base


def eval_class_map(classes: Sequence[str], class_map_file: str | None, num_classes: int | None,
                   model_class_names: Sequence[str] | None) -> tuple[dict[str, int] | None, str]:
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
            raise UsageError(f"{len(unknown)} of {len(classes)} class folders ({', '.join(unknown[:3])}) are not "
                             f"among the model's class names ({', '.join(list(model_class_names)[:5])}...); "
                             "pass --class-map to say which output each folder is")
        return {name: index[name.lower()] for name in classes}, "labels matched to the model's class names"
    mapping = imagenet_class_map(classes, num_classes)
    if mapping is not None:
        return mapping, "labels are the ImageNet-1k indices of the synset folders"
    synsets = set(ImageNetInfo().label_names()) if num_classes == 1000 else set()
    if synsets and any(name in synsets for name in classes):
        raise UsageError("some class folders are ImageNet synsets and some are not; pass --class-map")
    return None, "labels by sorted folder order (the model stores no class names)"


def bad_image_handler(policy: str, skipped: list[str],
                      keep_batches_full: bool = False) -> Callable[[list[BadSample]], None]:
    """--on-bad-image: stop naming the file (error), or warn once per file and record it in ``skipped``
    (skip). With ``keep_batches_full`` (training), a bad image that nothing could replace stops the run
    instead: a shorter or empty batch must never reach the model."""
    if policy not in ON_BAD_IMAGE:
        raise UsageError(f"--on-bad-image {policy!r}: choose error or skip")
    seen: set[str] = set()

    def handle(samples: list[BadSample]) -> None:
        for sample in samples:
            if policy == "error":
                raise UsageError(f"cannot read image {sample.path} ({sample.reason}); "
                                 "use --on-bad-image skip to skip unreadable images")
            if keep_batches_full and not sample.replaced:
                raise UsageError(f"cannot read image {sample.path} ({sample.reason}), and no readable training "
                                 "image is left to take its place")
            if sample.path in seen:
                continue
            seen.add(sample.path)
            instead = "; training uses another image in its place" if sample.replaced else ""
            print(f"warning: skipped unreadable image {sample.path} ({sample.reason}){instead}", file=sys.stderr)
            skipped.append(sample.path)

    return handle


def eval_device_loader(dataset: Dataset, batch_size: int, device: torch.device, workers: int | None,
                       data_config: dict[str, Any], channels_last: bool,
                       on_bad: Callable[[list[BadSample]], None] | None, sampler: Sampler | None = None,
                       persistent: bool = False, keep_bytes: int = 0) -> DeviceLoader:
    """One pass over ``dataset`` in order, as normalized batches on ``device``; with ``keep_bytes``, a
    set whose images fit in that many bytes is decoded once and replayed (:class:`KeptBatches`)."""
    loader: Any = make_loader(dataset, batch_size, device, workers, sampler=sampler, persistent=persistent)
    if keep_bytes:
        loader = KeptBatches(loader, keep_bytes)
    return DeviceLoader(loader, device, data_config["mean"], data_config["std"], channels_last=channels_last,
                        on_bad=on_bad)
