"""``bulk``'s flags, read before torch is imported: generated from their declarations
(vtools/options/tools.py, and the scripts' for the flags it shares with them)."""

from __future__ import annotations

import argparse

from vtools.cli.declared import add_declared
from vtools.cli.parser import OneLineParser
from vtools.options.tools import BulkFlags

DESCRIPTION = """\
``vtools bulk``: run validate.py or ``vtools benchmark`` for each model of a list, each in a process of its
own, into one results file (timm's bulk_runner.py).

timm's flags and model lists: --model-list is a wildcard over timm's names (vit_*), all (with
--pretrained: the models that have weights), all_in1k or all_res, or a file of names, each then run at
its pretrained input size and crop (and at its test size where it has one), as timm's runner does. The
script and its arguments follow; ``--model NAME`` (and the size) is added per model. Without --model-list
every timm model is planned, as in timm, and the count is said first. vtools' validate.py and benchmark
check their arguments once here (a data path that does not exist stops the bulk run, not each model). A
model whose run fails is a row with its error; the results file is rewritten after each model, and a bulk
run started again skips the runs it already holds a row for, by model and input size (a failed one is
tried again). A results file that is not such a table, or that is the --model-list file, is refused.

Examples:
  vtools bulk --model-list 'resnet1*' --results-file speeds.csv benchmark.py --bench inference
  vtools bulk --model-list models.txt --results-file val.csv validate.py /data/imagenet/val --pretrained
"""


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="vtools bulk", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_declared(parser, BulkFlags)
    return parser


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """bulk's options, each checked against its declared range as it is read."""
    return build_parser().parse_args(argv)
