"""Writing a model as ONNX and checking onnxruntime against PyTorch on real images.

Opset 17 goes through torch's TorchScript exporter (onnxruntime runs it, and it is
an opset Ascend's ATC takes); 18 and above through ``torch.export``. The comparison
uses the model's own eval preprocessing on real images, so it checks what ships.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from pathlib import Path
from typing import Any

import torch

from vtools.data.datasets import ImageFiles
from vtools.data.decode import BadSample
from vtools.data.loaders import eval_device_loader
from vtools.data.readers.folder import find_images
from vtools.data.transforms import eval_transform, image_mode
from vtools.errors import RunFailed, UsageError
from vtools.models.create import model_folder_of
from vtools.optional import optional_module


def default_output(output: str, checkpoint: str, model_name: str) -> Path:
    """``output`` (--output) if given, else beside the weights: beside the checkpoint, in the model folder,
    or ./<name>.onnx."""
    if output:
        return Path(output)
    if checkpoint:
        return Path(checkpoint).with_suffix("").with_suffix(".onnx")
    folder = model_folder_of(model_name)
    if folder is not None:
        return folder / "model.onnx"
    return Path(f"{Path(model_name).name.replace(':', '_')}.onnx")


def check_images(data: str, data_config: dict[str, Any], count: int) -> torch.Tensor:
    """Up to ``count`` real images from --data, through the same loader and normalization validate.py uses."""
    paths = find_images(data)[:count]
    dataset = ImageFiles(paths, None, eval_transform(data_config), image_mode(data_config))
    loader = eval_device_loader(dataset, len(paths), torch.device("cpu"), 0, data_config, False, _refuse_bad_image)
    return torch.cat([batch.images for batch in loader])


def _refuse_bad_image(samples: list[BadSample]) -> None:
    """The commands that check on a few --data images (export, parity) have no --on-bad-image to skip one:
    the first that fails stops them, with the advice that fits them."""
    for sample in samples:
        raise UsageError(
            f"--data: cannot use image {sample.path}: {sample.describe()}; remove it from --data, or give --data "
            "other images"
        )


def write_onnx(model: torch.nn.Module, example: torch.Tensor, path: Path, opset: int) -> None:
    """Export with a dynamic batch dimension; torch's exporter chatter is kept off the console."""
    kwargs: dict[str, Any] = {"input_names": ["input"], "output_names": ["logits"], "opset_version": opset}
    if opset >= 18:
        kwargs.update(dynamo=True, dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=65536)},))
    else:
        kwargs.update(dynamo=False, dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}})
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        try:
            torch.onnx.export(model, (example,), str(path), **kwargs)
        except Exception as err:  # the exporters raise many kinds for an op they cannot express
            raise RunFailed(
                f"ONNX export failed at opset {opset}: {type(err).__name__}: {str(err).splitlines()[0]}"
            ) from None


def compare(model: torch.nn.Module, path: Path, images: torch.Tensor) -> tuple[float, float, float]:
    """(max |logit difference|, largest |logit|, fraction of images with the same top-5 in order)."""
    ort = optional_module("onnxruntime", "the parity check")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    with torch.no_grad():
        reference = model(images)
    (exported,) = session.run(None, {session.get_inputs()[0].name: images.numpy()})
    exported = torch.from_numpy(exported)
    k = min(5, reference.shape[-1])
    same_top = (reference.topk(k).indices == exported.topk(k).indices).all(dim=1).float().mean().item()
    return (reference - exported).abs().max().item(), reference.abs().max().item(), same_top
