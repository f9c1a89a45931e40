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
import os
import sys

from vtools.cli.parser import OneLineParser
from vtools.data.readers.folder import find_images
from vtools.data.transforms import data_config_for
from vtools.deploy.export import check_images, compare, default_output, write_onnx
from vtools.errors import RunFailed, UsageError
from vtools.models.create import create_model, model_files
from vtools.optional import optional_module
from vtools.outputs import Output, check_outputs


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="python -m vtools export", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("model_name", metavar="MODEL", help="model folder, or timm name (with --pretrained)")
    parser.add_argument("--format", default="onnx", choices=("onnx",), help="(default: onnx)")
    parser.add_argument(
        "--data", required=True, metavar="DIR", help="real images for the parity check (a folder, searched recursively)"
    )
    parser.add_argument("--output", default="", metavar="PATH", help="where to write (default: beside the weights)")
    parser.add_argument("--opset", type=int, default=17, help="ONNX opset (default: 17)")
    parser.add_argument("--check-images", type=int, default=64, metavar="N", help="images compared (default: 64)")
    parser.add_argument("--atol", type=float, default=1e-4, help="allowed absolute logit difference (default: 1e-4)")
    parser.add_argument(
        "--rtol", type=float, default=1e-3, help="allowed difference relative to the largest logit (default: 1e-3)"
    )
    parser.add_argument(
        "--pretrained",
        action="store_true",
        default=False,
        help="load a timm name's pretrained weights (model folders always bring theirs)",
    )
    parser.add_argument("--checkpoint", default="", metavar="PATH", help="weights to load into the model")
    parser.add_argument("--use-ema", action="store_true", default=False, help="the checkpoint's EMA weights")
    parser.add_argument("--num-classes", type=int, default=None, help="number of classifier outputs")
    parser.add_argument("--in-chans", type=int, default=None, help="number of input image channels")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    optional_module("onnx", "python -m vtools export")
    optional_module("onnxruntime", "python -m vtools export")
    target = default_output(args.output, args.checkpoint, args.model_name)
    if not target.parent.is_dir():
        raise UsageError(f"--output {target}: the folder {target.parent} does not exist")
    inputs = [*model_files(args.model_name), ("--checkpoint", args.checkpoint), ("--data", args.data)]
    own = not args.output  # the model folder's own ONNX file, brought up to date from its weights
    check_outputs(inputs, [Output("--output" if args.output else "the ONNX file", target, refreshes_run_file=own)])
    find_images(args.data)  # a bad --data fails before the model is built
    model = create_model(
        args.model_name,
        pretrained=args.pretrained,
        num_classes=args.num_classes,
        in_chans=args.in_chans,
        checkpoint=args.checkpoint or None,
        use_ema=args.use_ema,
    ).eval()
    data_config = data_config_for(model, {})
    images = check_images(args.data, data_config, max(1, args.check_images))
    staging = target.with_name(f".{target.name}.partial-{os.getpid()}")
    try:
        write_onnx(model, images[:2], staging, args.opset)
        difference, scale, same_top = compare(model, staging, images)
        print(
            f"onnxruntime vs PyTorch on {len(images)} images from {args.data}: max |logit difference| "
            f"{difference:.3g} (largest logit {scale:.3g}), same top-5 on {100 * same_top:.1f} %"
        )
        allowed = args.atol + args.rtol * scale
        if not difference <= allowed:
            raise RunFailed(
                f"the exported model does not match PyTorch: max |logit difference| {difference:.3g} > "
                f"{allowed:.3g} (--atol {args.atol} + --rtol {args.rtol} x {scale:.3g}); nothing written"
            )
        staging.replace(target)
    finally:
        staging.unlink(missing_ok=True)
    print(f"wrote {target} (opset {args.opset}, input {tuple(data_config['input_size'])}, dynamic batch)")
    sys.stdout.flush()
    return 0
