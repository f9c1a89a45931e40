"""A warm interpreter for the scripts the tests run: the same process a user starts, minus the start-up.

Most of the suite's time went to starting Python and importing torch, torchvision and timm (about 8 s of
CPU per script on the 2-core host, against a fraction of a second for what most error cases check). A
warm server imports those three once per test process and runs each script in a child forked from it:
the child takes the caller's environment, folder, argv and ``sys.path``, runs the script as ``__main__``
(or ``-m vtools``), then shuts down as Python does (non-daemon threads joined, atexit handlers run, streams
flushed) and exits with the code Python would give. vtools itself is never imported before the fork, so
each child loads the package, its emulated devices and their settings fresh.

What a fork cannot reproduce goes to a fresh interpreter instead (:func:`can_run_warm`): anything that is
not a script or ``-m vtools``, interpreter flags, runs that need file modes to apply (setpriv), and any
environment variable other than vtools' own that differs from the server's, since torch and
huggingface_hub read theirs (backend autoload, PYTHONPATH, OpenMP threads, offline mode) at import.
"""

from __future__ import annotations

import atexit
import io
import json
import os
import runpy
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from types import TracebackType

WARM_IMPORTS = ("torch", "torchvision", "timm")
# Native libraries read these when they load (OpenMP, MKL, the loader, the locale, the interpreter itself),
# out of sight of the record the server keeps of the variables Python code read while importing.
NATIVE_PREFIXES = ("OMP_", "KMP_", "GOMP_", "MKL_", "OPENBLAS_", "LD_", "LC_", "LANG", "PYTHON", "TORCH", "PYTORCH")


def can_run_warm(args: list[str], env: dict[str, str], server_env: dict[str, str], read_at_import: set[str]) -> bool:
    """Whether ``python <args>`` under ``env`` runs the same in a child of a server started under
    ``server_env`` whose imports read ``read_at_import``: a script or ``-m vtools``, and no variable that
    the imports (or the native libraries they load) read has changed."""
    is_script = bool(args) and args[0].endswith(".py")
    if not (is_script or args[:2] == ["-m", "vtools"]):
        return False
    changed = {key for key in env.keys() | server_env.keys() if env.get(key) != server_env.get(key)}
    return not any(key in read_at_import or key.startswith(NATIVE_PREFIXES) for key in changed)


class WarmPython:
    """One server per test process, started on first use; ``run`` mirrors ``subprocess.run`` with
    ``capture_output=True, text=True``."""

    def __init__(self, repo: Path, env: dict[str, str]) -> None:
        self.repo, self.env = repo, env
        self.server: subprocess.Popen | None = None
        self.read_at_import: set[str] = set()
        self.lock = threading.Lock()
        self.folder = Path(tempfile.mkdtemp(prefix="warm-python-"))

    def follow(self, env: dict[str, str]) -> None:
        """Take ``env`` as the server's own when it differs in a variable read at import: the test process
        itself changed (torch sets TORCHINDUCTOR_CACHE_DIR and KMP_* once it has compiled a function), and
        every later script would otherwise need a fresh interpreter. The next request starts the server."""
        self.can_run([], env)  # starts the server, which says what its imports read
        if not can_run_warm(["-m", "vtools"], env, self.env, self.read_at_import):
            self.close()
            self.env = dict(env)

    def can_run(self, args: list[str], env: dict[str, str]) -> bool:
        """Whether ``python <args>`` under ``env`` can run in a child of this server (starting it to learn
        which variables its imports read)."""
        if self.server is None or self.server.poll() is not None:
            self._start()
        return can_run_warm(args, env, self.env, self.read_at_import)

    def run(self, args: list[str], env: dict[str, str], cwd: Path, timeout: float) -> subprocess.CompletedProcess:
        """``python <args>`` in a child, or in a fresh interpreter while a child of this server still runs."""
        command = [sys.executable, *args]
        if not self.lock.acquire(blocking=False):  # a second script at once (a test's threads): a fresh one
            return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
        try:
            reply = self._ask({"args": args, "env": env, "cwd": str(cwd), "timeout": timeout})
        finally:
            self.lock.release()
        stdout = Path(reply["stdout"]).read_text(errors="replace")
        stderr = Path(reply["stderr"]).read_text(errors="replace")
        for name in ("stdout", "stderr"):
            Path(reply[name]).unlink()
        if reply["timed_out"]:
            raise subprocess.TimeoutExpired(command, timeout, stdout, stderr)
        return subprocess.CompletedProcess(command, reply["returncode"], stdout, stderr)

    def _start(self) -> None:
        self.server = subprocess.Popen(
            [sys.executable, "-m", "tests.warm_python", str(self.folder)],
            cwd=self.repo,
            env=self.env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        atexit.register(self.finish)
        self.read_at_import = set(self._reply()["read_at_import"])

    def _ask(self, request: dict) -> dict:
        if self.server is None or self.server.poll() is not None:
            self._start()
        self.server.stdin.write(json.dumps(request) + "\n")
        self.server.stdin.flush()
        return self._reply()

    def _reply(self) -> dict:
        line = self.server.stdout.readline()
        if not line:
            raise RuntimeError(f"the warm Python server ended (exit code {self.server.wait()})")
        return json.loads(line)

    def close(self) -> None:
        if self.server is not None and self.server.poll() is None:
            self.server.stdin.close()
            self.server.wait(timeout=30)
        self.server = None

    def finish(self) -> None:
        """Stop the server and remove the folder this object made for its children's output."""
        self.close()
        shutil.rmtree(self.folder, ignore_errors=True)


# ---------------------------------------------------------------- the server and its children


def serve(folder: Path) -> None:
    """Import the heavy libraries once, then run one child per request line on stdin, answering on stdout."""
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # nothing the libraries print can break the replies
    read_at_import = _import_recording_reads(WARM_IMPORTS)
    replies.write(json.dumps({"read_at_import": sorted(read_at_import)}) + "\n")
    replies.flush()
    for line in sys.stdin:
        request = json.loads(line)
        out, err = (str(folder / f"{os.getpid()}-{name}") for name in ("stdout", "stderr"))
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(request, out, err)  # never returns
        returncode, timed_out = _wait(pid, request["timeout"])
        replies.write(json.dumps({"returncode": returncode, "timed_out": timed_out, "stdout": out, "stderr": err}))
        replies.write("\n")
        replies.flush()


def _import_recording_reads(modules: tuple[str, ...]) -> set[str]:
    """Import ``modules``, returning the names of the environment variables Python code read meanwhile
    (``os.environ[...]``, ``in``, ``.get`` and ``os.getenv`` all go through these two methods)."""
    read: set[str] = set()
    environ = type(os.environ)
    plain_getitem, plain_contains = environ.__getitem__, environ.__contains__

    def getitem(self: os._Environ, key: str) -> str:
        read.add(key)
        return plain_getitem(self, key)

    def contains(self: os._Environ, key: object) -> bool:
        read.add(str(key))
        return plain_contains(self, key)

    environ.__getitem__, environ.__contains__ = getitem, contains
    try:
        for name in modules:
            __import__(name)
    finally:
        environ.__getitem__, environ.__contains__ = plain_getitem, plain_contains
    return read


def _wait(pid: int, timeout: float) -> tuple[int, bool]:
    """The child's exit code as subprocess gives it (minus the signal for a kill), killed after ``timeout``."""
    ended = os.pidfd_open(pid)
    try:
        timed_out = not select.select([ended], [], [], timeout)[0]
    finally:
        os.close(ended)
    if timed_out:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), timed_out


def _child(request: dict, out: str, err: str) -> None:
    """Become ``python <args>`` in ``cwd`` under ``env``, run it, exit as Python would."""
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    os.dup2(os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), 1)
    os.dup2(os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), 2)
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
    sys.stdout = io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, "w", closefd=False)))
    sys.stderr = io.TextIOWrapper(
        io.BufferedWriter(io.FileIO(2, "w", closefd=False)), errors="backslashreplace", line_buffering=True
    )
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    tempfile.tempdir = None  # TMPDIR is read again, as a new process would
    args = request["args"]
    code = 0
    try:
        if args[0].endswith(".py"):
            sys.argv = list(args)
            sys.path[0] = str(Path(args[0]).resolve().parent)
            runpy.run_path(args[0], run_name="__main__")
        else:
            sys.argv = ["-m", *args[2:]]
            sys.path[0] = os.getcwd()
            runpy.run_module("vtools", run_name="__main__", alter_sys=True)
    except SystemExit as stop:
        code = _exit_code(stop.code)
    except BaseException as error:
        error.__traceback__ = _script_frames(error.__traceback__)  # Python's hook prints the error's own
        sys.excepthook(type(error), error, error.__traceback__)
        if isinstance(error, KeyboardInterrupt):  # Python ends by the signal, as the shell expects
            _shut_down()
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        code = 1
    _shut_down()
    os._exit(code)


def _script_frames(frames: TracebackType | None) -> TracebackType | None:
    """A traceback from the script's own first frame on, as a fresh interpreter prints it (without this
    module's and runpy's frames above it)."""
    while frames is not None and frames.tb_frame.f_code.co_filename in (_child.__code__.co_filename, "<frozen runpy>"):
        frames = frames.tb_next
    return frames


def _exit_code(value: object) -> int:
    """What Python exits with for ``sys.exit(value)``."""
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    print(value, file=sys.stderr)
    return 1


def _shut_down() -> None:
    threading._shutdown()  # the interpreter joins non-daemon threads before its atexit handlers
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass


if __name__ == "__main__":
    serve(Path(sys.argv[1]))
