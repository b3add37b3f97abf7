"""Selected base models: `select` caches a model's weights and records the choice in the store; a run may
start only from a selected model.

    from strop.control import base_models
    base_models.select("strop/tiny-random")       # {'modelId': ..., 'path': ..., 'selectedAt': ...}
"""

from __future__ import annotations

from sqlalchemy import select as sql_select

from strop.errors import StropError
from strop.models import select_model
from strop.store import open_store, session_scope
from strop.store.schema import SelectedBaseModel, utcnow


def select(model_id: str) -> dict:
    """Cache the weights (idempotent; a second call is instant) and record the selection."""
    path = select_model(model_id)
    with session_scope(open_store()) as s:
        row = s.get(SelectedBaseModel, model_id)
        if row is None:
            row = SelectedBaseModel(id=model_id, path=str(path))
            s.add(row)
        else:
            row.path, row.selected_at = str(path), utcnow()
        s.flush()
        return {"modelId": model_id, "path": str(path), "selectedAt": row.selected_at.isoformat()}


def selected() -> dict[str, str]:
    """Selected model ids and their local folders."""
    with session_scope(open_store(), read_only=True) as s:
        return {row.id: row.path for row in s.scalars(sql_select(SelectedBaseModel))}


def require_selected(model_id: str) -> str:
    """The local folder of a selected model; a clear error naming the command when it is not selected."""
    chosen = selected()
    if model_id not in chosen:
        raise StropError(f"base model {model_id!r} is not selected; run `strop base-models select {model_id} --wait` "
                         "first (selected: " + (", ".join(sorted(chosen)) or "none") + ")")
    return chosen[model_id]
