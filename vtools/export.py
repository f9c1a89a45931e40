"""``python -m vtools export MODEL``: write the model as ONNX, and prove onnxruntime gives its logits.

MODEL is a model folder (the ``.onnx`` lands inside it, beside the weights and
the ``config.json`` that holds its preprocessing and class names), a timm name
(with ``--pretrained``), or any of those with ``--checkpoint`` (the ``.onnx``
lands beside the checkpoint). The batch dimension is dynamic; the input size is
the model's data config.

Opset 17 by default, written by torch's TorchScript exporter: onnxruntime runs
it, and it is an opset Ascend's ATC takes to make an ``.om`` (not tested here).
``--opset 18`` and above use torch's newer ``torch.export`` exporter instead.

The file is written under a temporary name and checked before it is renamed
into place: real images from ``--data`` go through the model's own eval
preprocessing into both PyTorch and onnxruntime, and the largest logit
difference and top-5 agreement are printed. A difference beyond the tolerance
is an error (exit 3), and no file is left behind.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import warnings
from pathlib import Path
from typing import Any

import torch

from vtools import data as vdata
from vtools.cli import OneLineParser
from vtools.errors import RunFailed, UsageError
from vtools.models import create_model, model_folder_of
from vtools.optional import optional_module


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="python -m vtools export", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_name", metavar="MODEL", help="model folder, or timm name (with --pretrained)")
    parser.add_argument("--format", default="onnx", choices=("onnx",), help="(default: onnx)")
    parser.add_argument("--data", required=True, metavar="DIR",
                        help="real images for the parity check (a folder, searched recursively)")
    parser.add_argument("--output", default="", metavar="PATH", help="where to write (default: beside the weights)")
    parser.add_argument("--opset", type=int, default=17, help="ONNX opset (default: 17)")
    parser.add_argument("--check-images", type=int, default=64, metavar="N",
                        help="images compared (default: 64)")
    parser.add_argument("--atol", type=float, default=1e-4, help="allowed absolute logit difference (default: 1e-4)")
    parser.add_argument("--rtol", type=float, default=1e-3,
                        help="allowed difference relative to the largest logit (default: 1e-3)")
    parser.add_argument("--pretrained", action="store_true", default=False,
                        help="load a timm name's pretrained weights (model folders always bring theirs)")
    parser.add_argument("--checkpoint", default="", metavar="PATH", help="weights to load into the model")
    parser.add_argument("--use-ema", action="store_true", default=False, help="the checkpoint's EMA weights")
    parser.add_argument("--num-classes", type=int, default=None, help="number of classifier outputs")
    parser.add_argument("--in-chans", type=int, default=None, help="number of input image channels")
    return parser


def default_output(args: argparse.Namespace) -> Path:
    """Beside the weights: in the model folder, beside the checkpoint, or ./<name>.onnx."""
    if args.output:
        return Path(args.output)
    if args.checkpoint:
        return Path(args.checkpoint).with_suffix("").with_suffix(".onnx")
    folder = model_folder_of(args.model_name)
    if folder is not None:
        return folder / "model.onnx"
    return Path(f"{Path(args.model_name).name.replace(':', '_')}.onnx")


def check_images(data: str, data_config: dict[str, Any], count: int) -> torch.Tensor:
    """Up to ``count`` real images, through the same loader and normalization validate.py uses."""
    paths = vdata.find_images(data)[:count]
    dataset = vdata.ImageFiles(paths, None, vdata.eval_transform(data_config), vdata.image_mode(data_config))
    loader = vdata.eval_device_loader(dataset, len(paths), torch.device("cpu"), 0, data_config, False,
                                      vdata.bad_image_handler("error", []))
    return torch.cat([batch.images for batch in loader])


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
            raise RunFailed(f"ONNX export failed at opset {opset}: {type(err).__name__}: "
                            f"{str(err).splitlines()[0]}") from None


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


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    optional_module("onnx", "python -m vtools export")
    optional_module("onnxruntime", "python -m vtools export")
    target = default_output(args)
    if not target.parent.is_dir():
        raise UsageError(f"--output {target}: the folder {target.parent} does not exist")
    vdata.find_images(args.data)  # a bad --data fails before the model is built
    model = create_model(args.model_name, pretrained=args.pretrained, num_classes=args.num_classes,
                         in_chans=args.in_chans, checkpoint=args.checkpoint or None, use_ema=args.use_ema).eval()
    data_config = vdata.data_config_for(model, {})
    images = check_images(args.data, data_config, max(1, args.check_images))
    staging = target.with_name(f".{target.name}.partial-{os.getpid()}")
    try:
        write_onnx(model, images[:2], staging, args.opset)
        difference, scale, same_top = compare(model, staging, images)
        print(f"onnxruntime vs PyTorch on {len(images)} images from {args.data}: max |logit difference| "
              f"{difference:.3g} (largest logit {scale:.3g}), same top-5 on {100 * same_top:.1f} %")
        allowed = args.atol + args.rtol * scale
        if not difference <= allowed:
            raise RunFailed(f"the exported model does not match PyTorch: max |logit difference| {difference:.3g} > "
                            f"{allowed:.3g} (--atol {args.atol} + --rtol {args.rtol} x {scale:.3g}); nothing written")
        staging.replace(target)
    finally:
        staging.unlink(missing_ok=True)
    print(f"wrote {target} (opset {args.opset}, input {tuple(data_config['input_size'])}, dynamic batch)")
    sys.stdout.flush()
    return 0
