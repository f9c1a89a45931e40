"""Build (once) and load the emulated-NPU C++ extension.

The build goes to a fixed directory, ``~/.cache/vtools/emulated_npu/<torch
version>`` (or ``$VTOOLS_EMU_NPU_BUILD_DIR``). torch.utils.cpp_extension hashes
the sources and flags, holds a file lock during the build and lets ninja skip
up-to-date objects, so only the first import anywhere on the machine compiles;
later imports, also from other processes, just load the .so.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from types import ModuleType

import torch

EXTENSION_NAME = "vtools_emulated_npu"
SOURCES = [
    Path(__file__).with_name("npu_backend.cpp"),
    Path(__file__).with_name("npu_runtime.cpp"),
    Path(__file__).with_name("npu_autocast.cpp"),
    Path(__file__).with_name("npu_overflow.cpp"),
]

_extension: ModuleType | None = None


def build_dir() -> Path:
    override = os.environ.get("VTOOLS_EMU_NPU_BUILD_DIR")
    if override:
        return Path(override)
    # "+cu130" etc. are fine in a directory name.
    return Path.home() / ".cache" / "vtools" / "emulated_npu" / torch.__version__


def _put_ninja_on_path() -> None:
    """pip installs the ninja executable beside this interpreter; that folder may not be on PATH
    (pyenv shims, venvs used without activation), and cpp_extension needs ninja even to load."""
    import shutil

    if shutil.which("ninja") is None:
        os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")


def _needs_build(directory: Path) -> bool:
    """Whether no built library is there yet, or a source is newer than it (cpp_extension decides by a hash
    of the sources; this only chooses whether to say that a build may take a while)."""
    built = directory / f"{EXTENSION_NAME}.so"
    return not built.is_file() or any(source.stat().st_mtime > built.stat().st_mtime for source in SOURCES)


def load_extension(verbose: bool = False) -> ModuleType:
    """Compile on first use, then return the (cached) extension module."""
    global _extension
    if _extension is None:
        # Importing cpp_extension logs "No CUDA runtime is found" on CPU-only
        # hosts; keep that out of the stderr of CLI tests.
        cpp_logger = logging.getLogger("torch.utils.cpp_extension")
        old_level = cpp_logger.level
        cpp_logger.setLevel(logging.ERROR)
        try:
            from torch.utils import cpp_extension
        finally:
            cpp_logger.setLevel(old_level)

        _put_ninja_on_path()
        directory = build_dir()
        directory.mkdir(parents=True, exist_ok=True)
        if _needs_build(directory):  # a minute of silence would look like a hang
            print(
                f"emulated npu: compiling its C++ extension into {directory} (once per machine and torch version; "
                "1 to 3 minutes on two cores, the longer on a busy host)",
                file=sys.stderr,
                flush=True,
            )
        _extension = cpp_extension.load(
            name=EXTENSION_NAME,
            sources=[str(s) for s in SOURCES],
            extra_cflags=["-O1"],
            build_directory=str(directory),
            with_cuda=False,
            verbose=verbose,
        )
    return _extension
