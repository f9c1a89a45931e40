"""Images in, batches on the device out: decoding, datasets, transforms, loaders, sampling.

Rule: the data path of every script; ``readers/`` holds one module per kind of store
(and the registry that picks one), ``shard_writer.py`` writes what the wds and hfds
readers read. Knows nothing of models or training; may import the layers below.
"""
