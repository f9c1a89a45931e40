"""One module per command, named as the command (``vtools train|validate|infer|env|export|shards|plot|
compare|parity|avg-checkpoints|clean-checkpoint|benchmark|bulk``; vtools/cli/registry.py lists them once).

Rule: the top layer. A command whose options are parsed before torch (its flags module in vtools/cli/)
gives ``run(options)``; the others give ``main(argv)`` and parse with their generated ``build_parser()``.
The work lives in the packages below. The root scripts (``train.py``, ``validate.py``, ``inference.py``)
and ``python -m vtools`` run these through ``vtools.cli.runner``.
"""
