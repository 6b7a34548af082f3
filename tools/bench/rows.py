"""The result row every benchmark group gives run.py: openreg against a reference, as a ratio."""

from __future__ import annotations

from typing import Dict, Optional


def ratio_row(
    group: str,
    id_: str,
    measure: str,
    openreg_s: float,
    reference_s: float,
    goal: Optional[float] = None,
    details: Optional[Dict] = None,
) -> Dict:
    """A row of times (seconds in, microseconds out); ratio = openreg / reference, lower is better;
    `goal`, if any, is the highest ratio that meets it."""
    ratio = openreg_s / reference_s
    row = {
        "id": id_,
        "group": group,
        "measure": measure,
        "openreg": openreg_s * 1e6,
        "cpu": reference_s * 1e6,
        "unit": "us",
        "ratio": ratio,
        "goal_spec": None if goal is None else {"on": "ratio", "op": "<=", "value": goal},
        "met": None if goal is None else ratio <= goal,
        "status": "ok",
    }
    if details is not None:
        row["details"] = details
    return row
