"""A local data path that does not exist, said before torch and timm load.

The readers would say the same after the imports: seconds on an idle host, tens of seconds on a busy one, for
a typo. Only a plain local path for the image-folder reader is checked here; URLs, ``pipe:`` commands, glob
patterns and the other dataset kinds (which may download or stream) are left to their readers.
"""

from __future__ import annotations

from pathlib import Path

from vtools.errors import UsageError


def is_plain_local_path(source: str) -> bool:
    """Whether ``source`` names one file or folder on this host (not a URL, a command or a pattern)."""
    return "://" not in source and not source.startswith("pipe:") and not any(char in source for char in "*?[")


def check_data_exists(source: str | None, dataset: str = "") -> None:
    """Refuse an image folder (or file list) that is not there, in the words the folder reader uses."""
    if not source or dataset or not is_plain_local_path(source):
        return
    path = Path(source).expanduser()
    if not path.exists():
        raise UsageError(f"{path} does not exist")
