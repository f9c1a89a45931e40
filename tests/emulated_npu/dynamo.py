"""Dynamo backends the emulated npu registers under torch_npu's names (``npu``, ``npugraph_ex``, ``npugraphs``).

torch_npu registers them through its ``torch_dynamo_backends`` entry points (its ``entry_points.txt``); the
emulator's autoload folder does the same (``autoload/``), so that ``torch.compile(..., backend="npu")`` finds one
wherever the emulator is installed as torch_npu is. Each runs the captured graph as it is, eagerly: what it
proves is the selection of a backend by name, not anything of torch_npu's graph modes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def _eager(gm: torch.fx.GraphModule, example_inputs: list[Any], **kwargs: Any) -> Callable[..., Any]:
    return gm.forward


npu = npugraph_ex = npugraphs = _eager
