"""Seeing what a run does: the trackers (TensorBoard, W&B, MLflow), training curves, profiles of the real loop,
the environment report, operators that fell back to the host, and cross-device parity.

Rule: reads what runs produce (their events, vtools/run_events.py) or what the runtime reports; imports the
layers below train, never train itself (its parity recipe run, vtools/train/parity_recipe.py, imports this).
"""
