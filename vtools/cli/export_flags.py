"""``python -m vtools export``'s flags, read before torch is imported: generated from their declarations
(vtools/options/tools.py, and the scripts' for the flags it shares with them)."""

from __future__ import annotations

import argparse

from vtools.cli.declared import add_declared
from vtools.cli.parser import OneLineParser
from vtools.options.shared import ModelFlags
from vtools.options.tools import ExportFlags

DESCRIPTION = """\
``python -m vtools export MODEL``: write the model as ONNX, and prove onnxruntime gives its logits.

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


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="python -m vtools export", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
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


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """export's options, each checked against its declared range as it is read."""
    return build_parser().parse_args(argv)
