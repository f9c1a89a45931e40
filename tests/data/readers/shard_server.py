"""A real HTTP shard server for the stream tests, run as its own process (``python shard_server.py DIR``).

It serves DIR on 127.0.0.1 at a free port, which it prints as its first line. With ``--die-after N`` it
answers N shard (``.tar``) requests whole, then sends the next shard's first bytes and exits: the server
goes away mid-transfer, and later connections are refused. Its own process, not a thread of the test:
loader workers forked from a process that runs the server would hold its connections open.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

SERVED = [0]
LOCK = threading.Lock()


class Handler(SimpleHTTPRequestHandler):
    die_after: int | None = None

    def log_message(self, *args: object) -> None:
        pass

    def copyfile(self, source, destination) -> None:  # type: ignore[no-untyped-def]
        if self.path.endswith(".tar") and self.die_after is not None:
            with LOCK:
                SERVED[0] += 1
                dying = SERVED[0] > self.die_after
            if dying:
                destination.write(source.read(2048))
                destination.flush()
                os._exit(0)  # the server goes away: this transfer is cut, the next connection refused
        super().copyfile(source, destination)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("directory")
    parser.add_argument("--die-after", type=int, default=None)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    Handler.die_after = args.die_after
    ThreadingHTTPServer.allow_reuse_address = True
    server = ThreadingHTTPServer(("127.0.0.1", args.port), functools.partial(Handler, directory=args.directory))
    print(server.server_address[1], flush=True)
    sys.stdout.close()
    server.serve_forever()


@contextlib.contextmanager
def serve(directory: Path, die_after: int | None = None, port: int = 0) -> Iterator[str]:
    """The URL of a server process serving ``directory`` (see the module's docstring), stopped after."""
    extra = [] if die_after is None else ["--die-after", str(die_after)]
    proc = subprocess.Popen(
        [sys.executable, __file__, str(directory), "--port", str(port), *extra], stdout=subprocess.PIPE, text=True
    )
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        assert line.strip().isdigit(), f"the shard server did not start ({line!r})"
        yield f"http://127.0.0.1:{line.strip()}"
    finally:
        proc.kill()
        proc.wait(timeout=30)


if __name__ == "__main__":
    main()
