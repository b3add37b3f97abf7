"""Behaviour rubrics of tool-use episodes, from the counters an environment keeps in `state()`.

    rubric_metrics([env.state() for env in finished])   # {"rubric/tablesListedFirst": 0.75, ...}

They are weight-0 metrics: logged every training step and aggregated in evaluation reports, never rewarded,
so they show which behaviours RL changed (discovering tables before querying, inventing names, recovering
from SQL errors, answering at all).
"""

from __future__ import annotations

import math
import statistics

# state key -> metric name; booleans become fractions of episodes, counts become means per episode
RUBRICS = {
    "tables_listed_before_query": "tablesListedFirst",
    "hallucinated_tables": "hallucinatedTables",
    "hallucinated_columns": "hallucinatedColumns",
    "sql_errors": "sqlErrors",
    "recoveries": "recoveries",
    "turns": "turns",
    "submitted": "submitted",
    "correct": "correct",
}


def rubric_metrics(states: list[dict]) -> dict[str, float]:
    """The mean of each rubric over the states that hold it as a finite number (a remote environment's state
    comes from another server: a NaN, an infinity or an integer past float's range is left out, not averaged)."""
    out = {}
    for key, name in RUBRICS.items():
        values = [v for v in (_number(s.get(key)) for s in states) if v is not None]
        if values:
            out[f"rubric/{name}"] = statistics.fmean(values)
    return out


def _number(value) -> float | None:
    if not isinstance(value, (bool, int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None
