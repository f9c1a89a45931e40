"""Fast defaults: channels_last where it helps, decided per model and device type."""

from __future__ import annotations

import timm
import torch

from tests.conftest import load_emulated_npu
from vtools.models.prepare import is_convnet, use_channels_last


def test_channels_last_defaults() -> None:
    cnn = timm.create_model("test_resnet", num_classes=3)
    vit = timm.create_model("test_vit", num_classes=3)
    assert is_convnet(cnn) and not is_convnet(vit)
    load_emulated_npu()
    cpu, npu, cuda = torch.device("cpu"), torch.device("npu", 0), torch.device("cuda", 0)
    assert use_channels_last(None, cnn, cpu) and use_channels_last(None, cnn, cuda)
    assert not use_channels_last(None, vit, cpu)
    assert not use_channels_last(None, cnn, npu)  # Ascend prefers its own formats
    assert use_channels_last(True, vit, npu) and not use_channels_last(False, cnn, cpu)
