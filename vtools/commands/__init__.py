"""One module per command, named as the command (``vtools train|validate|infer|env|export|shards|plot|
compare|parity|avg-checkpoints|clean-checkpoint|benchmark|bulk``; vtools/cli/registry.py lists them once).

Rule: the top layer. Each gives ``run(options)``, which takes what its flags module in vtools/cli/
(``<name>_flags.py``) parsed and checked before torch was imported; the work lives in the packages below.
The root scripts (``train.py``, ``validate.py``, ``inference.py``) and ``python -m vtools`` run these
through ``vtools.cli.runner``.
"""
