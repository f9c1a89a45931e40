"""Which card a device index is: the backend's visible-devices variable, read as the backend reads it.

A process sees its devices numbered from 0; ``ASCEND_RT_VISIBLE_DEVICES=4,5`` makes npu:0 card 4. What names a
card to an operator (the device node a leftover job holds, ``npu-smi``'s list, the line naming a stopped rank)
must be the card, and the variable must be read as the backend reads it, or ``0, 1`` would look like two
devices where the runtime sees one. Which rows list numeric ids is data (``DeviceKind.numeric_visible_ids``).
"""

from __future__ import annotations

import os

import torch

from vtools.runtime.device_kinds import DeviceKind, kind_of


def visible_ids(text: str) -> list[int]:
    """A numeric visible-devices variable as the backend reads it (torch_npu's ``_parse_visible_devices``): the
    ids up to the first character that is neither a digit nor a comma, and up to the first empty entry, so
    ``0, 1`` is device 0 alone and ``0,,1`` too."""
    end = next((at for at, char in enumerate(text) if not (char.isdigit() or char == ",")), len(text))
    ids = []
    for entry in text[:end].split(","):
        if not entry:
            break
        ids.append(int(entry))
    return ids


def physical_card(device: torch.device, kind: DeviceKind | None = None) -> int | None:
    """The card behind an accelerator's index: its row's visible-devices variable maps index N to the Nth id it
    lists; without one (or for a non-numeric one) the index is the card. None for the host. ``kind``: the row
    (the device type's own by default)."""
    kind = kind or kind_of(device.type)
    if kind.host:
        return None
    index = device.index or 0
    if kind.numeric_visible_ids and kind.visible_env and kind.visible_env in os.environ:
        ids = visible_ids(os.environ[kind.visible_env])
        return ids[index] if index < len(ids) else index
    return index


def device_label(device: torch.device, kind: DeviceKind | None = None) -> str:
    """``npu:1``, or ``npu:1 (card 5)`` where the visible-devices variable maps it to another card."""
    card = physical_card(device, kind)
    return str(device) if card is None or card == (device.index or 0) else f"{device} (card {card})"
