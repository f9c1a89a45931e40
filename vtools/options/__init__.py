"""Every command's options, each declared once: a dataclass field with its flags, default, help, allowed
values and resume rule (``declare.py``), grouped in concerns the commands compose (``shared.py`` for the
flags several commands have, a module for each command's own).

Rule: declarations only, no argparse parser and no torch: the parsers are generated from these in
``vtools/cli/declared.py`` before torch is imported, and the library takes the typed concerns
(``train_job.py``). Imports only the base modules (``vtools.errors``, ``vtools.results``, ...).
"""
