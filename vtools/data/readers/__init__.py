"""Data sources: one module per kind of store, and the registry that picks one from ``--dataset``.

Rule: a reader returns a sample store (``vtools.data.datasets``) and the class names;
decoding, transforms and loading are the same for every kind.
"""
