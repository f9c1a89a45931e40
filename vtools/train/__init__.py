"""Training: the epoch loop, the recipe from timm's factories, checkpoints, resume and the run folder.

Rule: everything train.py does besides parsing its command line and printing; may
import evaluation and every layer below it.
"""
