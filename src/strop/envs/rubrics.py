"""Behaviour rubrics of tool-use episodes, from the counters an environment keeps in `state()`.

    rubric_metrics([env.state() for env in finished])   # {"rubric/tablesListedFirst": 0.75, ...}

They are weight-0 metrics: logged every training step and aggregated in evaluation reports, never rewarded,
so they show which behaviours RL changed (discovering tables before querying, inventing names, recovering
from SQL errors, answering at all).
"""

from __future__ import annotations

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
    out = {}
    for key, name in RUBRICS.items():
        values = [float(bool(s[key])) if isinstance(s.get(key), bool) else float(s[key])
                  for s in states if isinstance(s.get(key), (bool, int, float))]
        if values:
            out[f"rubric/{name}"] = statistics.fmean(values)
    return out
