"""Throughput measurement of the scripts' loops, and the one plain timm-style baseline they are compared with.

Rule: measures vtools' own loops (it imports train, evaluation and data) and keeps its
baseline free of vtools' loop code; never imported by the scripts.
"""
