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

from vtools.cli.declared import add_declared
from vtools.cli.parser import OneLineParser
from vtools.data.readers.folder import find_images
from vtools.data.transforms import data_config_for
from vtools.deploy.export import check_images, compare, default_output, write_onnx
from vtools.errors import RunFailed, UsageError
from vtools.models.create import create_model, model_files
from vtools.optional import optional_module
from vtools.options.shared import ModelFlags
from vtools.options.tools import ExportFlags
from vtools.outputs import Output, check_outputs


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="python -m vtools export", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_declared(parser, ExportFlags)
    changes = {
        "pretrained": {"help": "load a timm name's pretrained weights (model folders always bring theirs)"},
        "checkpoint": {"help": "weights to load into the model"},
        "use_ema": {"help": "the checkpoint's EMA weights"},
    }
    add_declared(
        parser, ModelFlags, only=("pretrained", "checkpoint", "use_ema", "num_classes", "in_chans"), changes=changes
    )
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
