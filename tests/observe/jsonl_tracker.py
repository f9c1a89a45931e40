"""JSON lines: what a run sends its trackers, one JSON object a line, appended to the file $VTOOLS_JSONL names."""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from typing import Any

from vtools.observe.tracking import TrackerEntry
from vtools.run_events import LogPoint, RunEnd

VARIABLE = "VTOOLS_JSONL"  # switches it on, in train.py and validate.py alike: it has no flag of its own


class JsonlTracker:
    """Each call runs on the tracker's own thread; whatever it raises is a warning line, never the run's end."""

    name = "JSON lines"

    def __init__(self, path: str) -> None:
        self.where = path  # said at the start: "tracking: JSON lines (PATH)"
        self.file: Any = None

    def start(self) -> None:
        self.file = open(self.where, "a", encoding="utf-8")

    def write(self, kind: str, figures: dict[str, Any]) -> None:
        self.file.write(json.dumps({"kind": kind, **figures}) + "\n")

    def step(self, point: LogPoint) -> None:  # train.py: a log step
        self.write("step", asdict(point))

    def epoch(self, row: dict[str, Any]) -> None:  # train.py: an epoch's summary.csv row
        self.write("epoch", row)

    def result(self, row: dict[str, Any]) -> None:  # validate.py: a model's results row
        self.write("result", row)

    def end(self, end: RunEnd) -> None:
        self.write("end", {"status": end.status, **end.summary})
        self.file.close()


ENTRY = TrackerEntry(
    "JSON lines",
    flags=(),
    asked=lambda flags: bool(os.environ.get(VARIABLE)),
    training=lambda flags, run: JsonlTracker(os.environ[VARIABLE]),
    validation=lambda flags, run: JsonlTracker(os.environ[VARIABLE]),
)
