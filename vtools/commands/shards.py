"""``python -m vtools shards FOLDER OUT``: write an image folder as tar shards (or parquet), atomically.

Its options, and what ``--help`` says of it: vtools/cli/shards_flags.py.
"""

from __future__ import annotations

from pathlib import Path

from vtools.options.declare import ParsedOptions
from vtools.outputs import Output, check_outputs
from vtools.runtime.cpu_budget import usable_cores


def run(args: ParsedOptions) -> int:
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
