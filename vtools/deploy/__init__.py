"""Shipping a trained model: ONNX export checked against PyTorch on real images.

Rule: may import models, data and the layers below; never training or commands.
"""
