"""One result line per scenario (see conftest.py): printed, and kept for pytest's summary."""

from __future__ import annotations

import os


def report(line: str) -> None:
    print(line, flush=True)
    path = os.environ.get("SCENARIO_RESULTS")
    if path:
        with open(path, "a") as f:
            f.write(line.rstrip() + "\n")
