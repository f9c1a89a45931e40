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

from vtools.cli.parser import OneLineParser
from vtools.errors import UsageError
from vtools.outputs import Output, check_outputs
from vtools.runtime.cpu_budget import usable_cores


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m vtools shards", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "source",
        metavar="FOLDER",
        help="image folder: a root of split folders (train/, val/...) or one split's class folders",
    )
    parser.add_argument("out", metavar="OUT", help="output folder (must not exist, or be empty)")
    parser.add_argument(
        "--format",
        default="wds",
        choices=("wds", "parquet"),
        help="tar shards for wds/NAME (default), or parquet for hfds/NAME",
    )
    parser.add_argument("--name", default="", help="dataset name in shard file names (default: OUT's name)")
    parser.add_argument("--split", default=None, help="FOLDER is this one split (default: find train/val/test)")
    parser.add_argument("--shard-size", type=int, default=1000, metavar="N", help="samples per shard (default: 1000)")
    parser.add_argument(
        "--max-side",
        type=int,
        default=None,
        metavar="N",
        help="store images re-encoded with the longer side at most N pixels",
    )
    parser.add_argument(
        "--workers",
        "-j",
        type=int,
        default=len(usable_cores()),
        help="processes that re-encode images with --max-side (default: the usable cores)",
    )
    args = parser.parse_args(argv)
    for flag, value in (
        ("--shard-size", args.shard_size),
        ("--max-side", args.max_side or 1),
        ("--workers", args.workers),
    ):
        if value < 1:
            raise UsageError(f"{flag} must be positive, got {value}")
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
        args.workers,
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
