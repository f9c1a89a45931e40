"""The three scripts' code: ``train.py``, ``validate.py`` and ``inference.py`` at the repository root and
``vtools train|validate|infer`` (after ``pip install .``) both call these modules' ``main``."""
