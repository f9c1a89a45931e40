"""One module per command, named as the command: ``vtools train|validate|infer|bench|env|export|shards|plot``.

Rule: the top layer. Each module holds its command's options and ``main(argv)``; the
work lives in the packages below. The root scripts (``train.py``, ``validate.py``,
``inference.py``) and ``python -m vtools`` run these through ``vtools.cli.runner``.
"""
