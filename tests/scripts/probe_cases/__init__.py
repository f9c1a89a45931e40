"""The adversarial probe's cases, kept: one YAML table per area, run by tests/scripts/test_probe_cases.py.

Each ``<area>.yaml`` is a list of cases, each a whole command as a user types it:

``id``
    unique over all tables;
``args``
    the command line after ``python`` (``train.py ...``, ``-m vtools bulk ...``);
``exit``
    the expected exit code;
``first_words``
    for a non-zero exit, words the one stderr line must hold (exactly one line, no traceback); for exit 0,
    words stdout or stderr must hold (may be empty);
``setup`` (optional)
    a function of ``<area>.py`` beside the table, called ``setup(tmp)`` before the command;
``absent`` (optional)
    paths under the test's folder that must not exist afterwards (nothing half-written);
``unchanged`` (optional)
    paths under the test's folder whose bytes must be the same afterwards (nothing overwritten);
``check`` (optional)
    a function of ``<area>.py``, ``check(tmp, proc)``, for what the words cannot say;
``slow`` (optional)
    true for a case that trains or measures (it runs in the full suite only).

``{tmp}``, ``{data}`` (the shipped Fashion-MNIST subset) and ``{repo}`` in args and words are filled in.
"""
