"""Where a script runs: the device, its precision, the host's cores, the process group.

Rule: everything device-specific lives here, and only ``device.py`` may name a backend's
module or package (tests/rules/test_source_tree.py checks it); the other modules ask it. Imports only
the base modules (``vtools.errors``, ...), never the layers above.
"""
