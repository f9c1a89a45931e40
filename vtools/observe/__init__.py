"""Seeing what a run does: training curves, profiles of the real loop, the environment report, operators
that fell back to the host, and cross-device parity.

Rule: reads what runs produce or what the runtime reports; may import the layers below train.
"""
