"""The npu row, the host-fallback audit and the emulator, checked against the real torch_npu 2.14.0 wheel.

Everything vtools says about Ascend was first written from documentation, and the emulator from the same
pages; a rename or a new message upstream would pass every emulated test. Here the real wheel is the reference
(tests/npu_wheel.py: downloaded once, checked against its sha256, read and never imported): the sentences its
library prints when an operator runs on the host, the names and signatures of its ``torch.npu`` functions, the
environment variables it reads. Each check fails on one misspelled name or one narrowed pattern.
"""

from __future__ import annotations

import ast
import inspect
import os
import re
import time
import types
from pathlib import Path
from typing import Any

import pytest
import torch

from tests import npu_wheel
from tests.conftest import REPO, load_emulated_npu
from vtools.cli.train_flags import build_parser
from vtools.cli.typed import typed_options
from vtools.errors import RunFailed
from vtools.observe import env_report
from vtools.observe.fallback import FallbackWatch
from vtools.options.train_job import TrainJob
from vtools.runtime import device as dev
from vtools.runtime import preflight
from vtools.runtime.device_chips import CHIP_FAMILIES, LIBRARY, family_of
from vtools.train.recipe import build_optimizer

SAMPLE_OP = "aten::isin.Tensor_Tensor_out"  # where the boxed fallback's sentence names its operator


def printed(sentence: str) -> str:
    """A sentence of the library as the backend prints it: c10's warning line around it."""
    text = sentence.format(op=SAMPLE_OP) if "{op}" in sentence else sentence
    return f"[W1206 04:28:00.000000000 compiler_depend.ts:51] Warning: {text} (function npu_cpu_fallback)"


def watched(lines: list[str], fatal: bool = False) -> FallbackWatch:
    """The audit of a run on npu while the backend wrote ``lines`` to file descriptor 2."""
    with FallbackWatch("npu", fatal=fatal) as watch:
        for line in lines:
            os.write(2, (line + "\n").encode())
        for _ in range(500 if fatal else 0):  # a fatal watch stops the block at the line; bounded, not timed
            time.sleep(0.01)
    return watch


# ---------------------------------------------------------------- what the backend says when it falls back


def test_the_library_has_every_fallback_form_vtools_knows(torch_npu_wheel: Path) -> None:
    """The sentences the audit and the emulator are written from are all in the wheel's library, and the
    library has no other: a new form upstream fails here until both learn it."""
    load_emulated_npu()
    from tests.emulated_npu import fallbacks

    sentences = npu_wheel.fallback_sentences(torch_npu_wheel)
    assert set(sentences) == set(fallbacks.every_sentence())
    assert len({re.sub(r"aten::\w+(?:\.\w+)?", "OP", s) for s in sentences}) >= 7  # the issue counted seven forms


def test_the_audit_counts_every_fallback_the_library_announces(torch_npu_wheel: Path) -> None:
    """Each sentence, printed as the backend prints it, is counted once for each operator it names (the
    logit line is three), read from the sentence itself, not from vtools' pattern."""
    sentences = npu_wheel.fallback_sentences(torch_npu_wheel)
    watch = watched([printed(sentence) for sentence in sentences])
    expected: dict[str, int] = {}
    for sentence in sentences:
        for op in npu_wheel.named_operators(printed(sentence)):
            expected[op] = expected.get(op, 0) + 1
    assert {entry.op: entry.count for entry in watch.fallbacks()} == expected
    assert {"aten::logit", "aten::logit_", "aten::logit.out", "aten::unfold_backward", SAMPLE_OP} <= set(expected)


def test_the_librarys_other_fallback_words_are_not_counted(torch_npu_wheel: Path) -> None:
    """Lines that mention a fallback without running an operator on the host (an error when CPU fallback is
    disabled, a memory query that falls back to another call, an HCCL retry) are not announcements."""
    sentences = set(npu_wheel.fallback_sentences(torch_npu_wheel))
    others = [
        text
        for text in npu_wheel.library_strings(torch_npu_wheel)
        if re.search(r"(?i)fall ?back", text) and text not in sentences and text not in npu_wheel.BOXED_PIECES
    ]
    assert any("CPU fallback is disabled" in text for text in others)  # the error form is among them
    watch = watched(others)
    assert watch.fallbacks() == []


@pytest.mark.parametrize("form", range(10))
def test_no_cpu_fallback_stops_at_each_form(form: int, torch_npu_wheel: Path) -> None:
    sentences = npu_wheel.fallback_sentences(torch_npu_wheel)
    assert len(sentences) == 10, "the library's sentences changed: update this test's range"
    line = printed(sentences[form])
    ops = npu_wheel.named_operators(line)
    with pytest.raises(RunFailed, match=re.escape(ops[0])) as stopped:
        watched([line], fatal=True)
    assert all(op in str(stopped.value) for op in ops)


# ---------------------------------------------------------------- the names vtools reaches, and how it calls them


class CallRecorder(types.ModuleType):
    """The emulated ``torch.npu``, noting every public name asked of it and every call made through it."""

    def __init__(self, module: types.ModuleType) -> None:
        super().__init__(module.__name__)
        self._module = module
        self.asked: set[str] = set()
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def __getattr__(self, name: str) -> Any:
        if not name.startswith("_"):
            self.asked.add(name)
        value = getattr(self._module, name)
        if name.startswith("_") or not callable(value):
            return value

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append((name, args, kwargs))
            return value(*args, **kwargs)

        return call


@pytest.fixture
def recorded_npu(monkeypatch: pytest.MonkeyPatch) -> CallRecorder:
    """vtools' device layer run on the emulated npu through a recorder: what it asks of ``torch.npu``."""
    load_emulated_npu()
    recorder = CallRecorder(torch.npu)
    monkeypatch.setattr(torch, "npu", recorder)
    torch.get_device_module.cache_clear()  # it caches the module per type
    try:
        device = dev.resolve_device("npu")
        dev.synchronize(device)
        dev.reset_peak_memory(device)
        dev.peak_memory_bytes(device)
        dev.is_bf16_supported(device)
        dev.device_name(device)
        dev.set_rng_state(device, dev.rng_state(device))
        stream = dev.new_stream(device)
        with dev.on_stream(device, stream):
            made = torch.ones(4, device=device)
        dev.wait_stream(device, stream, [made])
        env_report.collect("npu")
        preflight.apply_settings(device, recommended=False, named={"jit_compile": True})
        preflight.settings(dev.kind_of("npu"), device)
    finally:
        torch.get_device_module.cache_clear()
        from tests.emulated_npu import device as emulated

        emulated._compile_mode.clear()  # the setting made above, back to the chip's default
    return recorder


@pytest.mark.npu_only(reason="what vtools asks of torch.npu, compared with the real torch_npu")
def test_every_torch_npu_name_vtools_reaches_is_in_the_wheel(recorded_npu: CallRecorder, torch_npu_wheel: Path) -> None:
    real = npu_wheel.namespace(torch_npu_wheel, "torch_npu.npu")
    assert recorded_npu.calls, "nothing was called through torch.npu"
    assert sorted(recorded_npu.asked - set(real)) == []
    for name, args, kwargs in recorded_npu.calls:
        signature = npu_wheel.signature(real[name])
        assert signature is not None, f"torch_npu.npu.{name}: its signature cannot be read"
        try:
            signature.bind(*args, **kwargs)
        except TypeError as err:
            raise AssertionError(f"torch_npu.npu.{name}{signature} does not take vtools' call: {err}") from None
    called = {name for name, _, _ in recorded_npu.calls}
    assert {"set_device", "synchronize", "max_memory_allocated", "get_rng_state_all", "Stream"} <= called


def test_the_npu_rows_dotted_names_are_in_the_wheel(torch_npu_wheel: Path) -> None:
    """The toolkit-version function, the profiler module and the runtime settings the row names."""
    kind = dev.kind_of("npu")
    module, _, function = kind.toolkit_version.rpartition(".")
    assert function in npu_wheel.namespace(torch_npu_wheel, module), kind.toolkit_version
    assert npu_wheel.module_file(torch_npu_wheel, kind.profiler_module).is_file(), kind.profiler_module
    real = npu_wheel.namespace(torch_npu_wheel, "torch_npu.npu")
    settings_source = (torch_npu_wheel / "torch_npu" / "npu" / "npu_config.py").read_text(encoding="utf-8")
    targets = [target for setting in kind.runtime_settings for target in setting.targets]
    assert len(targets) == 4
    for target in targets:
        if target.endswith(")"):  # a call with one keyword
            function, keyword = target[:-1].split("(")
            npu_wheel.signature(real[function]).bind(**{keyword: False})
        else:  # an attribute of one of torch_npu.npu's setting objects (npu_config.py's classes)
            owner, attribute = target.split(".")
            assert isinstance(real[owner], ast.Assign), target
            assert f'name == "{attribute}"' in settings_source, target


def test_the_npu_rows_compile_backends_are_those_the_wheel_registers(torch_npu_wheel: Path) -> None:
    """torch_npu's Dynamo backends are its entry points (entry_points.txt, [torch_dynamo_backends]); the row's list
    is that list, and the emulator's metadata registers the same names."""
    import configparser

    def backends(path: Path) -> list[str]:
        parser = configparser.ConfigParser()
        parser.read(path)
        return sorted(parser["torch_dynamo_backends"])

    wheel = backends(torch_npu_wheel / "torch_npu-2.14.0.dist-info" / "entry_points.txt")
    emulator = backends(REPO / "tests/emulated_npu/autoload/vtools_emulated_npu-0.1.dist-info/entry_points.txt")
    assert sorted(dev.kind_of("npu").compile_backends) == wheel == emulator


def test_the_backend_profiler_calls_vtools_makes_bind_to_the_wheels(torch_npu_wheel: Path) -> None:
    """vtools/observe/profiling.py drives the row's profiler module (torch_npu.profiler on Ascend) through a
    variable named ``module``: every attribute it takes from it exists in the wheel, and each call's keywords
    bind to the real signature (read from the source, so a new call is checked without a new line here)."""
    tree = ast.parse((REPO / "vtools" / "observe" / "profiling.py").read_text(encoding="utf-8"))
    used = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "module"
    ]
    calls = {
        node.func.attr: node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func in used
    }
    real = npu_wheel.namespace(torch_npu_wheel, dev.kind_of("npu").profiler_module)
    assert {"ProfilerActivity", "profile", "schedule", "tensorboard_trace_handler"} <= {node.attr for node in used}
    assert sorted({node.attr for node in used} - set(real) - {"__name__"}) == []
    for name, call in calls.items():
        signature = npu_wheel.signature(real[name])
        assert signature is not None, name
        signature.bind(*[None] * len(call.args), **{keyword.arg: None for keyword in call.keywords})


def emulator_api() -> dict[str, ast.AST]:
    """The public functions and classes of the emulated ``torch.npu`` (tests/emulated_npu/device.py)."""
    tree = ast.parse((REPO / "tests" / "emulated_npu" / "device.py").read_text(encoding="utf-8"))
    return {
        node.name: node
        for node in tree.body
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_")
    }


def test_the_emulator_offers_only_the_wheels_api(torch_npu_wheel: Path) -> None:
    """Code written against the emulated torch.npu runs against the real one: every public name exists there,
    its positional parameters are the real ones' first, by name, and its keywords are taken there."""
    real = npu_wheel.namespace(torch_npu_wheel, "torch_npu.npu")
    emulated = emulator_api()
    assert sorted(set(emulated) - set(real)) == []
    for name, node in emulated.items():
        ours, theirs = npu_wheel.signature(node), npu_wheel.signature(real[name])
        if ours is None or theirs is None:
            continue
        positional = [p.name for p in ours.parameters.values() if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
        real_positional = [
            p.name for p in theirs.parameters.values() if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
        ]
        assert real_positional[: len(positional)] == positional, f"{name}{ours} against torch_npu's {name}{theirs}"
        theirs.bind_partial(**{p.name: None for p in ours.parameters.values() if p.kind is p.KEYWORD_ONLY})


@pytest.mark.npu_only(reason="the emulated npu's answers, compared with the real torch_npu's sources")
def test_the_emulator_answers_as_the_wheels_python_does(torch_npu_wheel: Path) -> None:
    """get_amp_supported_dtype's list and the invalid-device message, from the wheel's own sources."""
    load_emulated_npu()
    source = (torch_npu_wheel / "torch_npu" / "npu" / "autocast_utils.py").read_text(encoding="utf-8")
    assert "return [torch.float16, torch.bfloat16, torch.float32]" in source
    assert torch.npu.get_amp_supported_dtype() == [torch.float16, torch.bfloat16, torch.float32]
    init = (torch_npu_wheel / "torch_npu" / "npu" / "__init__.py").read_text(encoding="utf-8")
    assert 'raise AssertionError("Invalid device id" + pta_error(ErrCode.VALUE))' in init
    with pytest.raises(AssertionError, match=r"^Invalid device id\n\[ERROR\] .* ERR00003 PTA invalid value$"):
        torch.npu.get_device_name(99)


@pytest.mark.npu_only(reason="the emulated npu's out-of-memory error, compared with the real torch_npu's library")
def test_the_emulators_out_of_memory_error_is_torch_npus(torch_npu_wheel: Path) -> None:
    """An allocation past the device's memory fails as torch_npu's caching allocator fails: an OutOfMemoryError
    (what --retry and the memory estimate recognise) whose every fixed piece is in the real library."""
    load_emulated_npu()
    with pytest.raises(torch.OutOfMemoryError) as raised:
        torch.empty(65 << 30, dtype=torch.uint8, device="npu")  # refused before any host memory is asked for
    message = str(raised.value).splitlines()[0]
    assert message.startswith("NPU out of memory. Tried to allocate 65.00 GiB (NPU 0; 64.00 GiB total capacity")
    pieces = [piece for piece in re.split(r"\d+(?:\.\d+)? ?(?:GiB|MiB|KiB|bytes)?", message) if len(piece) >= 6]
    assert len(pieces) >= 6
    strings = npu_wheel.library_strings(torch_npu_wheel)
    assert [piece for piece in pieces if not any(piece in text for text in strings)] == []


# read by HCCL itself, not by torch_npu: their source is CANN 8.5.0's HCCL environment variable pages
HCCL_OWN = {"HCCL_SOCKET_IFNAME", "HCCL_IF_IP"}


def test_every_environment_variable_the_npu_row_names_is_read_by_the_wheel(torch_npu_wheel: Path) -> None:
    """Visible devices, collective timeouts, recommended settings and toolkit homes: a rename upstream fails.
    The interface variables are HCCL's own (the wheel does not read them: they must not appear there)."""
    names = dev.kind_of("npu").environment_variables()
    assert {"ASCEND_RT_VISIBLE_DEVICES", "HCCL_EXEC_TIMEOUT", "TASK_QUEUE_ENABLE", "ASCEND_HOME_PATH"} <= set(names)
    missing = [name for name in names if not npu_wheel.mentions(torch_npu_wheel, name)]
    assert sorted(missing) == sorted(HCCL_OWN)


# ---------------------------------------------------------------- choices the wheel contradicts


@pytest.mark.npu_only(reason="the fused steps torch_npu runs on the host")
def test_no_fused_step_the_wheel_runs_on_the_host_is_chosen_on_npu(torch_npu_wheel: Path) -> None:
    """torch_npu announces its fused Adam step as a host fallback: vtools' recipe never picks a fused step that
    the wheel runs on the host, checked by training a step under the audit (the emulator announces it too)."""
    load_emulated_npu()
    fused = {
        match.group(1)
        for sentence in npu_wheel.fallback_sentences(torch_npu_wheel)
        for match in re.finditer(r"aten::_fused_(\w+?)_\b", sentence)
    }
    assert "adam" in fused
    from tests.emulated_npu import fallbacks

    device = torch.device("npu")
    for opt in sorted(fused):
        model = torch.nn.Linear(4, 3).to(device)
        optim = typed_options(TrainJob, build_parser().parse_args(["--opt", opt])).optim
        optimizer = build_optimizer(model, optim, lr=0.1)
        with fallbacks.falling_back([]), FallbackWatch("npu") as watch:  # announcements afresh, as in a new run
            model(torch.randn(2, 4, device=device)).sum().backward()
            optimizer.step()
        assert [entry.op for entry in watch.fallbacks()] == [], opt


# ---------------------------------------------------------------- overflow on a chip that saturates


def test_the_npu_rows_float_status_names_are_the_wheels(torch_npu_wheel: Path) -> None:
    """The functions the row asks whether the chip saturates take no argument under torch_npu.npu, and the
    operators it reads and clears the flag with are registered by the wheel's library."""
    status = dev.kind_of("npu").float_status
    for dotted in (status.inf_nan_mode, status.forced_check):
        module, _, name = dotted.rpartition(".")
        real = npu_wheel.namespace(torch_npu_wheel, f"torch_npu.npu.{module}")
        npu_wheel.signature(real[name]).bind()  # vtools calls them with nothing
    strings = npu_wheel.library_strings(torch_npu_wheel)
    for operator in (status.read_op, status.clear_op):
        assert operator.replace(".", "::", 1) in strings, operator
    assert "FLOAT_STATUS_OP_DIMS_SIZE" not in strings  # a compile-time constant: the row's 8 is from the sources
    assert status.status_size == 8


EMULATOR = REPO / "tests" / "emulated_npu"


def test_the_emulators_float_status_api_and_words_are_the_wheels(torch_npu_wheel: Path) -> None:
    """The emulated torch.npu.utils offers only torch_npu.npu.utils's names, with their parameters; torch.npu
    re-exports the two the wheel's does; the operators keep the library's schemas; every message and variable
    is the wheel's."""
    real = npu_wheel.namespace(torch_npu_wheel, "torch_npu.npu.utils")
    tree = ast.parse((EMULATOR / "utils.py").read_text(encoding="utf-8"))
    ours = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name[0] != "_"}
    assert sorted(ours) == [
        "clear_npu_overflow_flag",
        "get_npu_overflow_flag",
        "is_force_overflow_check",
        "is_support_inf_nan",
        "npu_check_overflow",
    ]
    for name, node in ours.items():
        assert npu_wheel.signature(node) == npu_wheel.signature(real[name]), name
    package = npu_wheel.namespace(torch_npu_wheel, "torch_npu.npu")
    assert {"get_npu_overflow_flag", "clear_npu_overflow_flag", "utils"} <= set(package)
    strings = npu_wheel.library_strings(torch_npu_wheel)
    schemas = re.findall(r'm\.def\("([^"]+)"\)', (EMULATOR / "npu_overflow.cpp").read_text(encoding="utf-8"))
    assert len(schemas) == 4 and [schema for schema in schemas if schema not in strings] == []
    checks = re.findall(r'TORCH_CHECK\([^"]*"([^"]+)"', (EMULATOR / "npu_overflow.cpp").read_text(encoding="utf-8"))
    assert checks and [text for text in checks if text not in strings] == []
    wheel_utils = (torch_npu_wheel / "torch_npu" / "npu" / "utils.py").read_text(encoding="utf-8")
    for text in re.findall(r'(?:RuntimeError|warn)\(\s*"([^"]+)"', (EMULATOR / "utils.py").read_text("utf-8")):
        assert text in wheel_utils, text
    from tests.emulated_npu import chips

    pieces = chips.REFUSED_DISABLE.split("disable ")
    assert pieces[0] + "disable " in strings and pieces[1] in strings  # compiled in two pieces
    assert chips.OLD_CANN_FORCE.replace("{version}", "%s") in strings
    for variable in ("INF_NAN_MODE_ENABLE", "INF_NAN_MODE_FORCE_DISABLE", "FORCE_OVERFLOW_CHECK"):
        assert npu_wheel.mentions(torch_npu_wheel, variable), variable
    assert f"{'.'.join(str(n) for n in chips.FORCE_CHECK_CANN)}" in wheel_utils  # is_force_overflow_check's 9.1.0


def test_every_slow_path_the_library_announces_is_counted_by_its_kind(torch_npu_wheel: Path) -> None:
    """The library's sentences for work kept on the device but run slowly (the AI CPU) or at another precision
    (float64 cast to float32): each is matched by exactly one of the npu row's slow paths, each path matches one
    of them, and the emulator's AI CPU line is the library's."""
    from tests.emulated_npu import fallbacks

    paths = dev.kind_of("npu").slow_paths
    sentences = [
        text for text in npu_wheel.library_strings(torch_npu_wheel) if "on AiCpu" in text or "dtype cast rep" in text
    ]
    assert len(sentences) == 3
    for text in sentences:
        assert sum(bool(re.search(path.pattern, text)) for path in paths) == 1, text
    for path in paths:
        assert any(re.search(path.pattern, text) for text in sentences), path.kind
    assert fallbacks.AICPU_SORT in sentences


# ---------------------------------------------------------------- the chip table


def test_every_chip_the_table_names_is_one_the_wheel_knows(torch_npu_wheel: Path) -> None:
    """Each family's SoC names are in the library (they are what get_device_name reports), and no family claims
    another's."""
    strings = npu_wheel.library_strings(torch_npu_wheel)
    socs = [soc for family in CHIP_FAMILIES for soc in family.socs]
    assert [soc for soc in socs if soc not in strings] == []
    assert len(socs) == len(set(socs))
    for family in CHIP_FAMILIES:
        assert all(family_of(soc) is family for soc in family.socs), family.key
    assert family_of("Ascend950DT_9582x").key == "950" and family_of("Tesla V100") is None


def test_every_cell_the_wheel_states_is_stated_there(torch_npu_wheel: Path) -> None:
    """A cell sourced from the wheel names a file (or the library) and the words that state it: each is there.
    A cell without them is a document's only, and says which (its version in its source)."""
    checked = 0
    for family in CHIP_FAMILIES:
        for name, cell in family.cells().items():
            assert cell.source, (family.key, name)
            if cell.wheel is None:
                assert re.search(r"\d+\.\d+", cell.source) or "not documented" in cell.source, (family.key, name)
                continue
            where, text = cell.wheel
            if where == LIBRARY:
                found = any(text in line for line in npu_wheel.library_strings(torch_npu_wheel))
            else:
                found = text in (torch_npu_wheel / "torch_npu" / where).read_text(encoding="utf-8")
            assert found, (family.key, name, where, text)
            checked += 1
    assert checked >= 8  # the check is not vacuous
    strings = npu_wheel.library_strings(torch_npu_wheel)
    assert "wrapper_NPU___fused_adamw_" in strings and "wrapper_NPU___fused_sgd_" in strings  # both NPU kernels
