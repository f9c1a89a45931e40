"""Run a script as ``python <script> ...`` would, counting the folder listings it makes under one tree.

``python tests/scripts/count_scans.py OUT ROOT script.py args...``: an audit hook (``os.scandir`` raises an
audit event with the path it lists) counts the listings of ROOT and of every folder under it; at exit the
count, and a digest of each split the script opened (its paths and labels, in order), go to
``OUT/rank-<RANK>.json``. Used under torchrun to see that one rank lists the tree and every rank trains on
the same samples.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import runpy
import sys


def main() -> None:
    out, root, script, *args = sys.argv[1:]
    root = os.path.abspath(root)
    listings: list[str] = []
    opened: list[dict] = []

    def count(event: str, details: tuple) -> None:
        if event != "os.scandir" or not details or not isinstance(details[0], (str, bytes, os.PathLike)):
            return  # a listing by file descriptor (shutil.rmtree's) is not one of the tree
        if os.path.abspath(os.fsdecode(details[0])).startswith(root):
            listings.append(os.fsdecode(details[0]))

    sys.addaudithook(count)
    from vtools.data.readers import registry

    opened_by = registry.open_source

    def recording(request):  # type: ignore[no-untyped-def]
        source = opened_by(request)
        digest = hashlib.sha256()
        for path, label in zip(source.samples.paths, source.samples.labels):
            digest.update(f"{path}\t{label}\n".encode())
        opened.append({"split": request.split, "count": len(source), "digest": digest.hexdigest()})
        return source

    registry.open_source = recording
    for module in list(sys.modules.values()):  # the name as already imported elsewhere
        if getattr(module, "open_source", None) is opened_by and module is not registry:
            module.open_source = recording

    def write() -> None:
        record = {"listings": len(listings), "opened": opened}
        with open(os.path.join(out, f"rank-{os.environ.get('RANK', '0')}.json"), "w") as file:
            json.dump(record, file)

    atexit.register(write)
    sys.argv = [script, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
