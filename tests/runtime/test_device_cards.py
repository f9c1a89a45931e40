"""vtools/runtime/device_cards.py: the visible-devices variable read as the backend reads it, and the card behind
an index."""

from __future__ import annotations

import pytest
import torch

from vtools.runtime.device_cards import device_label, physical_card, visible_ids


@pytest.mark.parametrize(
    ("text", "ids"),
    [("0,1", [0, 1]), ("0, 1", [0]), ("4,5", [4, 5]), ("", []), ("x", []), ("0,,1", [0]), ("3,", [3]), ("12", [12])],
)
def test_visible_ids_are_read_as_the_backend_reads_them(text: str, ids: list[int]) -> None:
    """torch_npu's _parse_visible_devices: up to the first character that is not a digit or a comma, and up to
    the first empty entry."""
    assert visible_ids(text) == ids


def test_the_card_behind_an_index_follows_the_visible_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "4,5")
    assert physical_card(torch.device("npu:1")) == 5 and device_label(torch.device("npu:0")) == "npu:0 (card 4)"
    monkeypatch.delenv("ASCEND_RT_VISIBLE_DEVICES")
    assert device_label(torch.device("npu:1")) == "npu:1" and physical_card(torch.device("cpu")) is None
