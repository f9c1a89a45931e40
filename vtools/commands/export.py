"""``python -m vtools export MODEL``: write the model as ONNX, and prove onnxruntime gives its logits.

Its options, and what ``--help`` says of it: vtools/cli/export_flags.py.
"""

from __future__ import annotations

import os
import sys

from vtools.data.readers.folder import find_images
from vtools.data.transforms import data_config_for
from vtools.deploy.export import check_images, compare, default_output, write_onnx
from vtools.errors import RunFailed, UsageError
from vtools.models.create import create_model, model_files
from vtools.optional import optional_module
from vtools.options.declare import ParsedOptions
from vtools.outputs import Output, check_outputs


def run(args: ParsedOptions) -> int:
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
    images = check_images(args.data, data_config, args.check_images)
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
