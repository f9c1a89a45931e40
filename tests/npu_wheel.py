"""The real torch_npu wheel as a reference: downloaded once per machine, unpacked, never installed or imported.

torch_npu cannot import without Ascend's CANN, and on ``sys.path`` it makes ``import torch`` fail (torch
autoloads it), so the suite never installs it. What vtools and the emulator imitate of it is still written
down in the wheel: its Python sources (read here with :mod:`ast`) and the strings compiled into
``torch_npu/lib/libtorch_npu.so`` (the backend's messages, the environment variables it reads). This module
fetches the one release vtools pairs with (``pip download torch-npu==2.14.0 --no-deps``, for the platform
the wheel was built for, whatever this machine is), checks it against :data:`SHA256`, unpacks it into a cache
folder shared by every test process, and reads it.
"""

from __future__ import annotations

import ast
import fcntl
import hashlib
import inspect
import os
import re
import shutil
import subprocess
import sys
import tempfile
import warnings
import zipfile
from functools import cache
from pathlib import Path

REQUIREMENT = "torch-npu==2.14.0"
WHEEL = "torch_npu-2.14.0-cp311-cp311-manylinux_2_28_x86_64.whl"
SHA256 = "7736f7d82cf9f16c7dfc4537f7e7c638153da760273a193455e70857f912189e"
LIBRARY = "torch_npu/lib/libtorch_npu.so"
STRINGS_FILE = "libtorch_npu.strings"  # the library's printable strings, one a line, written once at unpacking
# pip's words when the registry is not there (urllib3's connection errors), as opposed to a refusal
_UNREACHABLE = re.compile(
    r"NewConnectionError|ConnectTimeoutError|Failed to establish a new connection|Temporary failure in name "
    r"resolution|Name or service not known|Network is unreachable|ProxyError|ReadTimeoutError|SSLError"
)
# a line of the library that says an operator runs on the host ("fall back to run on the CPU", "fallback to
# run on the CPU", "fall back to CPU"); "CPU fallback is disabled" (an error) and "Fall back to aclrt..." are not
FALLS_BACK_TO_CPU = re.compile(r"\bfall ?back to (?:run on )?(?:the )?CPU\b")
# the boxed fallback's sentence is compiled in pieces, the operator's name printed between the first two
BOXED_PIECES = (
    "CAUTION: The operator '",
    "' is not currently supported ",
    "on the NPU backend and will fall back to run on the CPU.",
    " This may have performance implications.",
)


class RegistryUnreachable(RuntimeError):
    """pip could not reach the package registry (no network), as opposed to any other failure."""


def cache_root() -> Path:
    """``$VTOOLS_TEST_CACHE``, else ``~/.cache/vtools-tests`` (``$XDG_CACHE_HOME`` respected)."""
    if os.environ.get("VTOOLS_TEST_CACHE"):
        return Path(os.environ["VTOOLS_TEST_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "vtools-tests"


def unpacked_wheel(root: Path | None = None) -> Path:
    """The folder holding the unpacked wheel (``torch_npu/``, ``torch_npu-2.14.0.dist-info/``), fetched and
    unpacked on first use; concurrent test processes wait for the one that does it."""
    root = root or cache_root()
    folder = root / f"torch_npu-2.14.0-{SHA256[:12]}"
    root.mkdir(parents=True, exist_ok=True)
    with open(root / "torch_npu-2.14.0.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folder / STRINGS_FILE).is_file():
            _unpack(_download(root), folder)
    return folder


def _download(root: Path) -> Path:
    """The wheel in ``root``, downloaded unless a copy with the right hash is there already."""
    wheel = root / WHEEL
    if wheel.is_file() and _sha256(wheel) == SHA256:
        return wheel
    with tempfile.TemporaryDirectory(dir=root) as scratch:
        command = [sys.executable, "-m", "pip", "download", REQUIREMENT, "--no-deps", "--only-binary=:all:"]
        command += ["--platform", "manylinux_2_28_x86_64", "--python-version", "3.11", "--implementation", "cp"]
        command += ["--abi", "cp311", "--timeout", "60", "--retries", "2", "--dest", scratch]
        proc = subprocess.run(command, capture_output=True, text=True, timeout=900)
        output = proc.stdout + proc.stderr
        if proc.returncode != 0:
            last = output.strip().splitlines()[-1] if output.strip() else f"exit {proc.returncode}"
            error = RegistryUnreachable if _UNREACHABLE.search(output) else RuntimeError
            raise error(f"pip download {REQUIREMENT} failed: {last}")
        fetched = Path(scratch) / WHEEL
        if not fetched.is_file():
            raise RuntimeError(f"pip download {REQUIREMENT} gave {os.listdir(scratch)}, not {WHEEL}")
        digest = _sha256(fetched)
        if digest != SHA256:
            raise RuntimeError(f"{WHEEL} has sha256 {digest}, not the {SHA256} kept in tests/npu_wheel.py")
        os.replace(fetched, wheel)
    return wheel


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _unpack(wheel: Path, folder: Path) -> None:
    """Unpack into a scratch folder, write the library's strings, then move it into place whole."""
    shutil.rmtree(folder, ignore_errors=True)
    scratch = Path(tempfile.mkdtemp(dir=folder.parent, prefix=".unpacking-"))
    try:
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(scratch)
        data = (scratch / LIBRARY).read_bytes()
        strings = (match.decode("ascii") for match in re.findall(rb"[\x20-\x7e]{6,}", data))
        (scratch / STRINGS_FILE).write_text("\n".join(strings) + "\n", encoding="ascii")
        os.replace(scratch, folder)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


# ---------------------------------------------------------------- reading the library's strings


@cache
def library_strings(folder: Path) -> tuple[str, ...]:
    """The printable strings of libtorch_npu.so (6 characters or more), as ``strings`` lists them."""
    return tuple((folder / STRINGS_FILE).read_text(encoding="ascii").splitlines())


def fallback_sentences(folder: Path) -> list[str]:
    """Every sentence in which the backend says it runs an operator on the host, as it prints it; the boxed
    fallback's (compiled in pieces) with ``{op}`` where the operator's name goes."""
    strings = library_strings(folder)
    missing = [piece for piece in BOXED_PIECES if piece not in strings]
    if missing:
        raise AssertionError(f"the boxed fallback's sentence is no longer compiled from these pieces: {missing}")
    boxed = BOXED_PIECES[0] + "{op}" + "".join(BOXED_PIECES[1:])
    sentences = set()
    for text in strings:
        if not FALLS_BACK_TO_CPU.search(text):
            continue
        sentences.add(boxed if text == BOXED_PIECES[2] else text)
    return sorted(sentences)


def named_operators(sentence: str) -> list[str]:
    """The operators a sentence names, read plainly (``aten::`` and a name, overload included)."""
    return re.findall(r"aten::\w+(?:\.\w+)?", sentence)


def mentions(folder: Path, word: str) -> list[str]:
    """Where the wheel has ``word``: files of its Python sources, and the library's strings."""
    found = [str(path.relative_to(folder)) for path in sorted(folder.rglob("*.py")) if word in path.read_text("utf-8")]
    if any(word in text for text in library_strings(folder)):
        found.append(LIBRARY)
    return found


# ---------------------------------------------------------------- reading the Python sources


def module_file(folder: Path, module: str) -> Path:
    """The source file of a dotted module name of the wheel (a package's ``__init__.py``)."""
    base = folder.joinpath(*module.split("."))
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


_NAMESPACES: dict[tuple[Path, str], dict[str, ast.AST]] = {}


def namespace(folder: Path, module: str) -> dict[str, ast.AST]:
    """The names a module of the wheel defines or imports, each with the definition it names (functions,
    classes; ``ast.alias`` for what cannot be followed into the wheel), read without importing.
    ``from .x import *`` follows ``x``'s ``__all__`` (or its public definitions). A module met again while it
    is being read (an import cycle) gives what has been read of it so far, as Python's import would; a
    package's ``from .sub import x`` also names ``sub`` (Python binds the submodule in its package)."""
    key = (folder, module)
    if key in _NAMESPACES:
        return _NAMESPACES[key]
    path = module_file(folder, module)
    tree = _parse(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: dict[str, ast.AST] = {}
    _NAMESPACES[key] = names
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[node.name] = node
        elif isinstance(node, ast.ImportFrom):
            source = _absolute(package, node)
            inside = source is not None and source.startswith("torch_npu") and module_file(folder, source).exists()
            if inside and node.level and node.module and path.name == "__init__.py":
                names.setdefault(node.module.split(".")[0], ast.alias(name=source))  # the import binds the submodule
            for alias in node.names:
                if alias.name == "*":
                    if inside:
                        names.update(_public(folder, source))
                    continue
                target = namespace(folder, source).get(alias.name, alias) if inside else alias
                names[alias.asname or alias.name] = target
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    names[target.id] = node
    return names


def _parse(path: Path) -> ast.Module:
    with warnings.catch_warnings():  # the wheel's own invalid escapes in strings are not ours to report
        warnings.simplefilter("ignore")
        return ast.parse(path.read_text(encoding="utf-8"))


def _absolute(package: str, node: ast.ImportFrom) -> str | None:
    if node.level == 0:
        return node.module
    parts = package.split(".")
    base = parts[: len(parts) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def _public(folder: Path, module: str) -> dict[str, ast.AST]:
    names = namespace(folder, module)
    tree = _parse(module_file(folder, module))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            listed = [elt.value for elt in getattr(node.value, "elts", []) if isinstance(elt, ast.Constant)]
            return {name: names[name] for name in listed if name in names}
    return {name: node for name, node in names.items() if not name.startswith("_")}


def signature(node: ast.AST) -> inspect.Signature | None:
    """The call signature of a function (or a class's constructor) read from its source; None when the
    source does not say (a name imported from outside the wheel, a class with no constructor of its own)."""
    if isinstance(node, ast.ClassDef):
        init = next(
            (n for n in node.body if isinstance(n, ast.FunctionDef) and n.name in ("__init__", "__new__")), None
        )
        if init is None:
            return None
        return _drop_first(signature(init))
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    args = node.args
    kinds = inspect.Parameter
    params = []
    positional = args.posonlyargs + args.args
    first_default = len(positional) - len(args.defaults)
    for index, arg in enumerate(positional):
        kind = kinds.POSITIONAL_ONLY if index < len(args.posonlyargs) else kinds.POSITIONAL_OR_KEYWORD
        default = None if index >= first_default else inspect.Parameter.empty
        params.append(inspect.Parameter(arg.arg, kind, default=default))
    if args.vararg:
        params.append(inspect.Parameter(args.vararg.arg, kinds.VAR_POSITIONAL))
    for arg, default in zip(args.kwonlyargs, args.kw_defaults):
        params.append(inspect.Parameter(arg.arg, kinds.KEYWORD_ONLY, default=None if default else kinds.empty))
    if args.kwarg:
        params.append(inspect.Parameter(args.kwarg.arg, kinds.VAR_KEYWORD))
    return inspect.Signature(params)


def _drop_first(sig: inspect.Signature | None) -> inspect.Signature | None:
    """A method's signature as its callers see it (without ``self`` or ``cls``)."""
    if sig is None:
        return None
    params = list(sig.parameters.values())
    return sig.replace(parameters=params[1:])
