"""``python -m vtools shards FOLDER OUT``: write an image folder as tar shards (or parquet), atomically.

Shards follow the WebDataset layout timm reads (``<key>.jpg``/``.png``,
``<key>.cls``, ``<key>.json``) and come with a split-info file in timm's format
(``_info.json``: per split, its shard file names and sample counts) plus the
class names, so ``--dataset wds/NAME --data-dir OUT`` trains and validates
with no further flags. ``--format parquet`` writes the Hugging Face layout
(``data/<split>-00000-of-00001.parquet``, image and ClassLabel columns) for
``--dataset hfds/NAME``.

``--max-side N`` stores images re-encoded with their longer side at most N
(PNG stays PNG, the rest become JPEG): decoding full-size JPEGs is what limits
a fast accelerator, and random-resized crops of a 160-px-side copy rarely
need more. Without it, files are copied byte for byte.
"""

from __future__ import annotations

from pathlib import Path

from vtools.cli.declared import add_declared
from vtools.cli.parser import OneLineParser
from vtools.options.shared import LoadingFlags
from vtools.options.tools import ShardsFlags
from vtools.outputs import Output, check_outputs
from vtools.runtime.cpu_budget import usable_cores


def build_parser() -> OneLineParser:
    parser = OneLineParser(prog="python -m vtools shards", description=__doc__.split("\n\n")[0])
    add_declared(parser, ShardsFlags)
    changes = {"workers": {"help": "processes that re-encode images with --max-side (default: the usable cores)"}}
    add_declared(parser, LoadingFlags, only=("workers",), changes=changes)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # unset: the usable cores; 0 (the loaders' "in the main process"): one process here
    workers = len(usable_cores()) if args.workers is None else max(1, args.workers)
    out = Path(args.out)
    check_outputs([("FOLDER", args.source)], [Output("OUT", out, files=())])
    from vtools.data.shard_writer import convert  # the readers, Pillow and torch: after the checks

    info = convert(
        Path(args.source),
        out,
        args.name or out.name,
        args.format,
        args.shard_size,
        args.max_side,
        args.split,
        workers,
    )
    print(written_lines(info, out, args.format, args.name or out.name), flush=True)
    return 0


def written_lines(info: dict, out: Path, fmt: str, name: str) -> str:
    """What was written: each split's images (and shards), then the classes and the flags that read it."""
    lines = []
    for split_name, entry in info["splits"].items():
        shards = f" in {len(entry['filenames'])} shards" if "filenames" in entry else ""
        lines.append(f"{split_name}: {entry['num_samples']} images{shards}")
    reader = "wds" if fmt == "wds" else "hfds"
    lines.append(f"{len(info['classes'])} classes -> {out} (--dataset {reader}/{name} --data-dir {out})")
    return "\n".join(lines)
