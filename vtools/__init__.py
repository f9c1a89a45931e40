"""vtools: train, validate and run timm models on any PyTorch accelerator.

Importing vtools imports torch through a guard: if an installed device backend
(an NPU backend without CANN, say) breaks ``import torch``, the process ends with a
one-line explanation instead of a traceback.
"""

from vtools.device_autoload import import_torch as _import_torch

__version__ = "0.1.0"

_import_torch()
