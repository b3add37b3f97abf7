"""`strop serve-tinker`'s checkpoints in strop's store: each saved checkpoint becomes a tuned model (`strop models list`, `strop
serve MODEL`, `strop evaluations start --model MODEL`), from a run in project `tinker` that stands for the Tinker
training run (its configName is the Tinker training run id; its base model is selected if it was not).

    model_id, store_run_id = register_checkpoint("SESSION:train:0", run_info, checkpoint_folder)

The server (`strop.tinker_wire`) is handed this function by the command that starts it, so the store stays
the control plane's.
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import select

from strop.control import base_models
from strop.store import artifacts, open_store, session_scope
from strop.store.schema import Model, Project, Run, utcnow

PROJECT = "tinker"


def register_checkpoint(training_run_id: str, run_info: dict, folder: Path) -> tuple[str, str]:
    """(modelId, store runId) of the checkpoint at `folder`, registered now; the store run is made on the run's
    first checkpoint (`run_info["storeRunId"]` names it after that)."""
    if run_info["base_model"] not in base_models.selected():
        base_models.select(run_info["base_model"])     # what `strop serve MODEL` and evaluations start from
    sha = artifacts.put_dir(folder)
    with session_scope(open_store()) as s:
        project = s.scalars(select(Project).where(Project.name == PROJECT)).first()
        if project is None:
            project = Project(name=PROJECT)
            s.add(project)
            s.flush()
        run = s.get(Run, run_info["storeRunId"]) if run_info.get("storeRunId") else None
        if run is not None and run.config_name != training_run_id:
            run = None      # a record naming another training run's store run: never add models to that one
        if run is None:
            now = utcnow()
            run = Run(project_id=project.id, config_name=training_run_id, base_model=run_info["base_model"],
                      descriptor={"config": {"method": "tinker"},
                                  "tinker": {"trainingRunId": training_run_id, "loraRank": run_info.get("lora_rank"),
                                             "server": "strop serve-tinker"}},
                      status="succeeded", started_at=now, finished_at=now)
            s.add(run)
            s.flush()
        model = Model(run_id=run.id, base_model=run_info["base_model"], adapter_path=str(folder), artifact_sha256=sha)
        s.add(model)
        s.flush()
        run.model_id = model.id
        run.current_step = run.current_step + 1
        run.finished_at = utcnow()
        return model.id, run.id
