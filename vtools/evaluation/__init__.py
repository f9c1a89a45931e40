"""Evaluation: the model and loader of a pass (shared by validate.py and inference.py), one validated pair,
the evaluation and prediction loops (train.py's validation too), metrics and class reports.

Rule: everything validate.py and inference.py do besides parsing and printing; may import models, data and below.
"""
