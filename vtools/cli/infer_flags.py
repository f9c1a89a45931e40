"""inference.py's flags and the checks that need nothing but them, run before torch is imported."""

from __future__ import annotations

import argparse

from vtools.cli.declared import add_declared
from vtools.cli.eval_flags import add_eval_model_args, add_split, add_threshold
from vtools.cli.options import (
    add_data_source_args,
    add_dataset_args,
    add_device_args,
    add_loader_args,
    add_model_args,
    add_preprocess_args,
)
from vtools.cli.parser import OneLineParser, check_values
from vtools.errors import UsageError
from vtools.options.evaluation import InferFlags

DESCRIPTION = """Top-k predictions of a timm model for a folder, glob, list file or single image, on any device.

Examples:
  python inference.py photos/ --model resnet50.a1_in1k --pretrained --topk 5 --label-type description
  python inference.py data/fashion-mnist-mini/val --model runs/fmnist/model --topk 3 --results-dir out
"""


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    group = parser.add_argument_group("data")
    add_data_source_args(group, "SOURCE", "a folder (searched recursively), a glob, a .txt file of paths, or one image")
    add_dataset_args(group)
    add_split(group, "inference")
    add_model_args(parser)
    add_eval_model_args(parser, "inference")
    add_preprocess_args(parser)
    add_loader_args(parser, batch_size=256)
    add_device_args(parser)
    group = parser.add_argument_group(InferFlags.title)
    add_declared(group, InferFlags)
    add_threshold(group, "each image lists every such class, with its probability, instead of the top-k")
    return parser


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """inference.py's options, with every check that reads only them done."""
    return check(build_parser().parse_args(argv))


def data_source(args: argparse.Namespace) -> str | None:
    """The images inference.py reads: SOURCE, else --data-dir."""
    return args.data or args.data_dir


def check(args: argparse.Namespace) -> argparse.Namespace:
    """Every check of inference.py's options that reads only them: the command line's and the Python API's."""
    check_values(args)
    check_inference_args(args)
    return args


def check_inference_args(args: argparse.Namespace) -> None:
    """What to classify, with which model, and how many classes: before any device work."""
    if not (args.data or args.data_dir):
        raise UsageError("give the images to classify (SOURCE or --data-dir)")
    if not args.model:
        raise UsageError("--model is required (a timm name, hf-hub:..., or a model folder)")
    if args.exclude_output and args.topk == 0:
        raise UsageError("--exclude-output leaves only the top-k indices and labels: it needs --topk 1 or more")
