"""torchvision's datasets as ``--dataset torch/<name>``, with the items every reader gives."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torchvision
from torch.utils.data import Dataset

from vtools.data.datasets import SampleStore
from vtools.data.decode import BadSample, RawSample
from vtools.data.step_errors import bad_sample_from
from vtools.errors import UsageError

# torchvision datasets reachable as --dataset torch/<name>: class and how it names its splits
_TORCH_DATASETS: dict[str, tuple[str, str]] = {
    "cifar10": ("CIFAR10", "train_flag"),
    "cifar100": ("CIFAR100", "train_flag"),
    "mnist": ("MNIST", "train_flag"),
    "fashion_mnist": ("FashionMNIST", "train_flag"),
    "kmnist": ("KMNIST", "train_flag"),
    "qmnist": ("QMNIST", "train_flag"),
    "svhn": ("SVHN", "split_test"),
    "stl10": ("STL10", "split_test"),
    "food101": ("Food101", "split_test"),
    "flowers102": ("Flowers102", "split_val"),
    "dtd": ("DTD", "split_val"),
    "imagenet": ("ImageNet", "split_val"),
}


class TorchvisionSamples(SampleStore):
    """A torchvision dataset as a store: its items are decoded already (read by :class:`TorchvisionImages`),
    and it names a sample only by its position, as ``<--dataset>[<index>]``."""

    own_names = False

    def __init__(self, dataset: Dataset, label: str) -> None:
        self.dataset = dataset
        self.label = label

    def __len__(self) -> int:
        return len(self.dataset)

    def locate(self, index: int) -> RawSample | BadSample:
        raise TypeError(f"{self.label} holds decoded images, not files or bytes: read it through TorchvisionImages")

    def name(self, index: int) -> str:
        return f"{self.label}[{index}]"


class TorchvisionImages(Dataset):
    """A torchvision dataset, with the same (image, label, index) items as :class:`ImageFiles`."""

    def __init__(self, dataset: Dataset, transform: Callable, mode: str) -> None:
        self.dataset = dataset
        self.transform = transform
        self.mode = mode

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> tuple[Any, int, int]:
        try:
            image, label = self.dataset[index]
            if isinstance(image, torch.Tensor):
                image = torchvision.transforms.functional.to_pil_image(image)
            return self.transform(image.convert(self.mode)), int(label), index
        except Exception as err:  # one bad sample, named, instead of a worker's traceback
            return bad_sample_from(err, f"{type(self.dataset).__name__}[{index}]"), -1, index


def torchvision_dataset(name: str, root: str, split: str, download: bool) -> Dataset:
    """``torch/<name>`` as a torchvision dataset rooted at ``root``."""
    key = name.removeprefix("torch/").lower()
    if key not in _TORCH_DATASETS:
        raise UsageError(
            f"--dataset {name}: unknown torchvision dataset (known: {', '.join('torch/' + k for k in _TORCH_DATASETS)})"
        )
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
