"""Tuned models: what a finished run registers (its adapter, on top of its base model).

    from strop.control import models
    models.get("model-2d69fb15")      # {'modelId': ..., 'runId': ..., 'baseModel': ..., 'adapterPath': ...}
"""

from __future__ import annotations

from sqlalchemy import select

from strop.errors import StropError
from strop.store import open_store, session_scope
from strop.store.schema import Evaluation, Model


class ModelError(StropError):
    """A tuned model could not be found or removed."""


def _dict(m: Model) -> dict:
    return {"modelId": m.id, "runId": m.run_id, "baseModel": m.base_model, "adapterPath": m.adapter_path,
            "sha256": m.artifact_sha256, "createdAt": m.created_at.isoformat()}


def list_all() -> list[dict]:
    with session_scope(open_store(), read_only=True) as s:
        return [_dict(m) for m in s.scalars(select(Model).order_by(Model.created_at.desc()))]


def get(model_id: str) -> dict:
    with session_scope(open_store(), read_only=True) as s:
        model = s.get(Model, model_id)
        if model is None:
            raise ModelError(f"no model {model_id!r}; `strop models list` shows the tuned models")
        return _dict(model)


def delete(model_id: str) -> dict:
    """Remove a model's record; refused while an evaluation refers to it (the evaluation is named)."""
    with session_scope(open_store()) as s:
        model = s.get(Model, model_id)
        if model is None:
            raise ModelError(f"no model {model_id!r}; `strop models list` shows the tuned models")
        users = s.scalars(select(Evaluation.id).where(Evaluation.model_id == model_id)).all()
        if users:
            raise ModelError(f"model {model_id} is used by evaluation(s) {', '.join(users)}; it is kept so their "
                             "results stay traceable")
        out = _dict(model)
        s.delete(model)
        return out
