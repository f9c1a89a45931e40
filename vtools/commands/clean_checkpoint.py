"""``vtools clean-checkpoint``: a training checkpoint's weights alone, for sharing (timm's clean_checkpoint.py).

Its options, and what ``--help`` says of it: vtools/cli/clean_checkpoint_flags.py.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch

from vtools.errors import UsageError
from vtools.models.checkpoint_weights import (
    check_weights_name,
    checkpoint_weights,
    read_training_checkpoint,
    sha256_of,
    without_aux_bn,
    write_weights,
)
from vtools.options.declare import ParsedOptions
from vtools.outputs import Output, check_outputs


def run(args: ParsedOptions) -> int:
    checkpoint = Path(args.checkpoint)
    if not args.checkpoint or not checkpoint.is_file():
        raise UsageError(f"--checkpoint {args.checkpoint or '(none given)'}: no such file")
    if args.output and Path(args.output).exists():
        raise UsageError(f"--output {args.output} already exists: give a new name")
    folder, stem, extension = output_parts(checkpoint, args.output, args.safetensors)
    check_weights_name("--output", folder / f"{stem}{extension}", args.safetensors)
    check_outputs([("--checkpoint", checkpoint)], [Output("--output", folder / f"{stem}{extension}")])
    state = checkpoint_weights(read_training_checkpoint(checkpoint), checkpoint, not args.no_use_ema)
    if args.clean_aux_bn:
        state = without_aux_bn(state)
    final, digest = write_cleaned(state, folder, stem, extension, args)
    print(f"wrote {final} ({len(state)} tensors, sha256 {digest})")
    return 0


def write_cleaned(
    state: dict[str, torch.Tensor], folder: Path, stem: str, extension: str, args: ParsedOptions
) -> tuple[Path, str]:
    """Write ``state`` under a staging name no other process or file has, then give it its final name
    (which holds its hash) only where that name is free: a hard link fails on an existing file, where a
    rename would replace it."""
    folder.mkdir(parents=True, exist_ok=True)
    handle, name = tempfile.mkstemp(dir=folder, prefix=f".{stem}.", suffix=".tmp")
    os.close(handle)
    staging = Path(name)
    try:
        write_weights(state, staging, args.safetensors)
        digest = sha256_of(staging)
        final = folder / (f"{stem}{extension}" if args.no_hash else f"{stem}-{digest[:8]}{extension}")
        put_in_place(staging, final)
    finally:
        staging.unlink(missing_ok=True)
    return final, digest


def put_in_place(staging: Path, final: Path) -> None:
    """``staging`` becomes ``final`` unless a file of that name exists (then one line, nothing replaced)."""
    try:
        os.link(staging, final)
    except FileExistsError as err:
        raise UsageError(f"{final} already exists: give another --output") from err
    except OSError:  # a filesystem without hard links: check, then rename (a narrow window, not none)
        if final.exists():
            raise UsageError(f"{final} already exists: give another --output") from None
        os.replace(staging, final)


def output_parts(checkpoint: Path, output: str, safetensors: bool) -> tuple[Path, str, str]:
    """(folder, name stem, extension) of the cleaned file, as timm names it: --output's, else the
    checkpoint's name less its last extension, in the current folder."""
    default_extension = ".safetensors" if safetensors else ".pth"
    if output:
        stem, extension = os.path.splitext(Path(output).name)
        return Path(output).parent, stem, extension or default_extension
    return Path("."), os.path.splitext(checkpoint.name)[0], default_extension
