"""Training: the epoch loop, the recipe from timm's factories, checkpoints, resume and the run folder.

Rule: everything train.py does besides parsing its command line and printing (and parity's run of
train.py's own step); may import observe, evaluation and every layer below them.
"""
