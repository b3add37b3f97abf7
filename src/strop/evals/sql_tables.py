"""A comparison's results as SQL tables anyone can query, through SQLAlchemy (any URL, or an engine: the
control plane passes the strop store's own when no URL is given).

    write_tables(comparison, url="sqlite:///results.db", mode="overwrite")
    # SELECT question, correct_a, correct_b FROM strop_eval_comparison WHERE correct_a <> correct_b

strop_eval_comparison: one row per item: question, ground truth, each model's answer and correctness.
strop_judge_scores: one row per item, model and judge metric: the score (NULL when no verdict could be had,
with the reason in `error`) and the judge's one-sentence reasoning.
Both carry `comparison_id`, so `append` keeps several comparisons apart; `replace` deletes only this
comparison's earlier rows and then appends (what `strop quickstart` uses, so other comparisons' rows stay);
`overwrite` replaces the tables (as the walkthrough's `mode("overwrite")` does), so never point it at tables whose
rows you need.
"""

from __future__ import annotations

from datetime import datetime, timezone

import sqlalchemy as sa

from strop.errors import StropError

COMPARISON_TABLE = "strop_eval_comparison"
JUDGE_TABLE = "strop_judge_scores"
MODES = ("overwrite", "append", "replace")


class ResultsError(StropError):
    """Results could not be written where asked."""


def _tables(metadata: sa.MetaData) -> tuple[sa.Table, sa.Table]:
    comparison = sa.Table(
        COMPARISON_TABLE, metadata,
        sa.Column("comparison_id", sa.String(40), nullable=False, index=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("item_index", sa.Integer, nullable=False),
        sa.Column("question", sa.Text, nullable=False),
        sa.Column("ground_truth", sa.Text),
        sa.Column("model_a", sa.Text, nullable=False), sa.Column("label_a", sa.Text, nullable=False),
        sa.Column("answer_a", sa.Text), sa.Column("correct_a", sa.Boolean, nullable=False),
        sa.Column("model_b", sa.Text, nullable=False), sa.Column("label_b", sa.Text, nullable=False),
        sa.Column("answer_b", sa.Text), sa.Column("correct_b", sa.Boolean, nullable=False),
    )
    judge = sa.Table(
        JUDGE_TABLE, metadata,
        sa.Column("comparison_id", sa.String(40), nullable=False, index=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("item_index", sa.Integer, nullable=False),
        sa.Column("question", sa.Text, nullable=False),
        sa.Column("ground_truth", sa.Text),
        sa.Column("side", sa.String(1), nullable=False),
        sa.Column("model", sa.Text, nullable=False), sa.Column("label", sa.Text, nullable=False),
        sa.Column("metric", sa.String(64), nullable=False),
        sa.Column("score", sa.Integer),
        sa.Column("reasoning", sa.Text),
        sa.Column("error", sa.Text),
    )
    return comparison, judge


def _engine(url: str | sa.Engine) -> sa.Engine:
    """`url` itself when it is an engine (the control plane passes the store's own: WAL, busy timeouts), else a
    fresh one for the URL."""
    if isinstance(url, sa.Engine):
        return url
    try:
        return sa.create_engine(url)
    except Exception as exc:  # noqa: BLE001 - a malformed URL or a missing driver: say which
        raise ResultsError(f"--results-url {url!r}: {exc}") from None


def _release(engine: sa.Engine, url: str | sa.Engine) -> None:
    if not isinstance(url, sa.Engine):  # one made here
        engine.dispose()


def write_tables(comparison: dict, *, url: str | sa.Engine, mode: str = "overwrite",
                 verdicts: dict[str, list[dict | None]] | None = None) -> dict:
    """Write both tables; `verdicts` ({"a": [...], "b": [...]}, each item's stored verdict) adds reasoning/errors."""
    if mode not in MODES:
        raise ResultsError(f"--mode must be one of {', '.join(MODES)}, got {mode!r}")
    engine = _engine(url)
    metadata = sa.MetaData()
    comparison_table, judge_table = _tables(metadata)
    now = datetime.now(timezone.utc)
    a, b = comparison["a"], comparison["b"]
    rows = [{"comparison_id": comparison["comparisonId"], "created_at": now, "item_index": item["index"],
             "question": item["question"], "ground_truth": item["gold"],
             "model_a": a["model"], "label_a": a["label"], "answer_a": item["a"]["answer"], "correct_a": bool(item["a"]["correct"]),
             "model_b": b["model"], "label_b": b["label"], "answer_b": item["b"]["answer"], "correct_b": bool(item["b"]["correct"])}
            for item in comparison["items"]]
    judge_rows = []
    judge = comparison.get("judge")
    if judge:
        for position, item in enumerate(comparison["items"]):
            for side, info in (("a", a), ("b", b)):
                stored = ((verdicts or {}).get(side) or [None] * len(comparison["items"]))[position] or {}
                for metric in judge["metrics"]:
                    scores = item[side]["judge"]
                    judge_rows.append({"comparison_id": comparison["comparisonId"], "created_at": now,
                                       "item_index": item["index"], "question": item["question"],
                                       "ground_truth": item["gold"], "side": side, "model": info["model"],
                                       "label": info["label"], "metric": metric,
                                       "score": None if scores is None else scores.get(metric),
                                       "reasoning": stored.get("reasoning"), "error": stored.get("error")})
    try:
        with engine.begin() as conn:
            if mode == "overwrite":
                metadata.drop_all(conn, checkfirst=True)
            else:
                _check_columns(conn, comparison_table, judge_table)
            metadata.create_all(conn, checkfirst=True)
            if mode == "replace":
                for table in (comparison_table, judge_table):
                    conn.execute(table.delete().where(table.c.comparison_id == comparison["comparisonId"]))
            conn.execute(comparison_table.insert(), rows)
            if judge_rows:
                conn.execute(judge_table.insert(), judge_rows)
    except ResultsError:
        raise
    except Exception as exc:  # noqa: BLE001 - a server that cannot be reached, a permission: say where
        raise ResultsError(f"could not write results to {engine.url.render_as_string(hide_password=True)}: "
                           f"{type(exc).__name__}: {exc}") from None
    finally:
        _release(engine, url)
    return {"url": engine.url.render_as_string(hide_password=True), "mode": mode,
            "tables": {COMPARISON_TABLE: len(rows), JUDGE_TABLE: len(judge_rows)}}


def _check_columns(conn, *tables: sa.Table) -> None:
    inspector = sa.inspect(conn)
    for table in tables:
        if inspector.has_table(table.name):
            have = {c["name"] for c in inspector.get_columns(table.name)}
            missing = sorted({c.name for c in table.columns} - have)
            if missing:
                raise ResultsError(f"table {table.name} exists without columns {missing}; append and replace need "
                                   "strop's layout: use --mode overwrite, or another --results-url")


def delete_comparison(comparison_id: str, *, url: str | sa.Engine) -> list[str]:
    """Delete one comparison's rows from both tables, dropping a table that is left empty; what was done."""
    engine = _engine(url)
    done = []
    try:
        with engine.begin() as conn:
            inspector = sa.inspect(conn)
            for table in _tables(sa.MetaData()):
                if not inspector.has_table(table.name):
                    continue
                deleted = conn.execute(table.delete().where(table.c.comparison_id == comparison_id)).rowcount
                left = conn.scalar(sa.select(sa.func.count()).select_from(table))
                if left == 0:
                    table.drop(conn)
                done.append(f"{table.name}: {deleted} rows deleted" + ("; table dropped (empty)" if left == 0 else
                                                                       f"; {left} rows of other comparisons kept"))
        return done
    finally:
        _release(engine, url)
