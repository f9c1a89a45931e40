"""timm models: creating them on a device, reading weights from any checkpoint, model folders, ONNX files.

Rule: what a script needs to get a model it can run; ``weights.py`` is the one place
that reads checkpoint files. May import ``vtools.cli``, ``vtools.runtime`` and the base.
"""
