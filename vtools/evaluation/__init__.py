"""The evaluation and prediction loops, shared by validate.py, inference.py and train.py's validation.

Rule: loops over batches already on the device; may import models, data and below.
"""
