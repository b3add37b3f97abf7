"""Checkpoints behind `tinker://` paths: plain folders under `$STROP_HOME/tinker/`, so they outlive the server.

    tinker://{training_run_id}/weights/{name}          -> tinker/runs/{training_run_id}/weights/{name}/
    tinker://{training_run_id}/sampler_weights/{name}  -> tinker/runs/{training_run_id}/sampler_weights/{name}/

A training run's folder holds `run.json` (base model, LoRA settings, owner, user metadata); a checkpoint folder is
a PEFT adapter (`adapter_config.json`, `adapter_model.safetensors`) written by strop's trainer, with the optimizer
state beside it for `weights` (what `save_state` / `load_state_with_optimizer` use) and `checkpoint.json` (time,
owner, metadata). Each run and checkpoint belongs to the API key that made it: another key is told it does not exist.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from datetime import datetime, timezone
from pathlib import Path

from strop.tinker_wire.codec import WireError

KINDS = {"weights": "training", "sampler_weights": "sampler"}
# used with fullmatch: `$` also matches before a final newline, which let a folder named "evil\n" through
RUN_ID = re.compile(r"[A-Za-z0-9_-]{1,64}:train:[0-9]{1,9}")
NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")


def check_name(name: str) -> str:
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise WireError(f"checkpoint name {name[:80]!r} is not allowed: use 1-128 letters, digits, '.', '_' or '-' "
                        "(no '/' and not starting with '.')" if isinstance(name, str) else "a checkpoint name must be a string")
    return name


def parse_path(path: str) -> tuple[str, str, str]:
    """(training_run_id, kind folder, name) of a tinker:// checkpoint path; WireError for anything else."""
    if not isinstance(path, str) or not path.startswith("tinker://"):
        raise WireError(f"{str(path)[:120]!r} is not a tinker:// checkpoint path; use the path a save returned, "
                        "such as tinker://RUN/weights/NAME")
    parts = path[len("tinker://"):].split("/")
    if len(parts) != 3 or parts[1] not in KINDS or not RUN_ID.fullmatch(parts[0]):
        raise WireError(f"{path[:160]!r} is not a checkpoint path of this server (tinker://RUN/weights/NAME or "
                        "tinker://RUN/sampler_weights/NAME)")
    return parts[0], parts[1], check_name(parts[2])


def atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, tz=timezone.utc).isoformat()


class CheckpointStore:
    def __init__(self, root: Path):
        self.root = Path(root)
        (self.root / "runs").mkdir(parents=True, exist_ok=True)

    def run_dir(self, run_id: str) -> Path:
        if not RUN_ID.fullmatch(run_id):
            raise WireError(f"{run_id[:80]!r} is not a training run id of this server")
        return self.root / "runs" / run_id

    def record_run(self, run_id: str, info: dict) -> None:
        folder = self.run_dir(run_id)
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_text(folder / "run.json", json.dumps(info, indent=1))

    def run_info(self, run_id: str, owner: str) -> dict:
        try:
            info = json.loads((self.run_dir(run_id) / "run.json").read_text())
        except (OSError, ValueError):
            raise WireError(f"no training run {run_id[:80]!r} for this API key", status=404) from None
        if info.get("owner") != owner:
            raise WireError(f"no training run {run_id[:80]!r} for this API key", status=404)
        return info

    def folder(self, path: str, owner: str, *, must_exist: bool = True, read: bool = False) -> tuple[Path, dict]:
        """(checkpoint folder, its run's info) for a tinker:// path of this owner's; with `read`, also one that
        another key published (to sample or load from, never to change). A checkpoint past its TTL is deleted
        here and is not found."""
        run_id, kind, name = parse_path(path)
        folder = self.run_dir(run_id) / kind / name
        try:
            info = self.run_info(run_id, owner)
        except WireError:
            if not (read and self.meta(folder).get("public")):
                raise
            info = json.loads((self.run_dir(run_id) / "run.json").read_text())
        if must_exist and not self._live(folder):
            raise WireError(f"no checkpoint {path[:160]!r} for this API key", status=404)
        return folder, info

    @staticmethod
    def meta(folder: Path) -> dict:
        try:
            meta = json.loads((folder / "checkpoint.json").read_text())
        except (OSError, ValueError):
            return {}                            # none yet (a save that did not finish), or not a checkpoint
        return meta if isinstance(meta, dict) else {}

    def _live(self, folder: Path) -> bool:
        """Whether the checkpoint exists and is within its TTL; one past it is deleted now."""
        meta = self.meta(folder)
        if not meta:
            return False
        if meta.get("expires_at") and meta["expires_at"] <= time.time():
            shutil.rmtree(folder, ignore_errors=True)
            return False
        return True

    def update(self, path: str, owner: str, **changes) -> dict:
        """Change fields of a checkpoint's checkpoint.json (its owner only); the new metadata."""
        folder, _ = self.folder(path, owner)
        meta = {**self.meta(folder), **changes}
        atomic_write_text(folder / "checkpoint.json", json.dumps(meta))
        return meta

    def path_for(self, run_id: str, kind: str, name: str) -> str:
        return f"tinker://{run_id}/{kind}/{check_name(name)}"

    def finish(self, path: str, owner: str, user_metadata: dict | None, ttl_seconds: int | None) -> None:
        folder, _ = self.folder(path, owner, must_exist=False)
        now = time.time()
        size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
        atomic_write_text(folder / "checkpoint.json", json.dumps({
            "time": now, "size_bytes": size, "user_metadata": user_metadata or None,
            "expires_at": now + ttl_seconds if ttl_seconds else None}))

    def register(self, path: str, owner: str, register_checkpoint) -> str:
        """Register a finished checkpoint with `register_checkpoint(run_id, run_info, folder) -> (modelId, store
        runId)` (strop.control.tinker_checkpoints); the modelId is kept in checkpoint.json."""
        folder, info = self.folder(path, owner)
        run_id = parse_path(path)[0]
        model_id, store_run = register_checkpoint(run_id, info, folder)
        if info.get("storeRunId") != store_run:
            self.record_run(run_id, {**info, "storeRunId": store_run})
        meta = json.loads((folder / "checkpoint.json").read_text())
        atomic_write_text(folder / "checkpoint.json", json.dumps({**meta, "model_id": model_id}))
        return model_id

    def checkpoints(self, run_id: str, owner: str) -> list[dict]:
        self.run_info(run_id, owner)
        out = []
        for kind, kind_name in KINDS.items():
            base = self.run_dir(run_id) / kind
            for folder in sorted(base.iterdir()) if base.is_dir() else ():
                if not self._live(folder):
                    continue                     # a save that did not finish, or one past its TTL
                meta = self.meta(folder)
                out.append({"checkpoint_id": f"{kind}/{folder.name}", "checkpoint_type": kind_name,
                            "time": iso(meta["time"]), "tinker_path": f"tinker://{run_id}/{kind}/{folder.name}",
                            "size_bytes": meta.get("size_bytes"), "public": bool(meta.get("public")),
                            "user_metadata": meta.get("user_metadata"),
                            "expires_at": iso(meta["expires_at"]) if meta.get("expires_at") else None})
        out.sort(key=lambda c: c["time"])
        return out

    def runs(self, owner: str, *, accessible: bool = False) -> list[tuple[str, dict]]:
        """This owner's training runs; with `accessible`, also other keys' runs that have a published checkpoint."""
        found = []
        for folder in sorted((self.root / "runs").iterdir()):
            try:
                info = json.loads((folder / "run.json").read_text())
            except (OSError, ValueError):
                continue
            if info.get("owner") == owner or (accessible and self.public_checkpoints(folder.name)):
                found.append((folder.name, info))
        return found

    def public_checkpoints(self, run_id: str) -> list[dict]:
        """A run's published checkpoints, as another key may list them."""
        try:
            owner = json.loads((self.run_dir(run_id) / "run.json").read_text()).get("owner")
        except (OSError, ValueError):
            return []
        return [c for c in self.checkpoints(run_id, owner) if c["public"]]

    def reap_runs(self, in_use) -> list[str]:
        """Remove the run folders that hold no checkpoint and whose run `in_use(run_id)` says is over (its
        session gone): each model ever created leaves one, and listings read them all. The ids removed."""
        removed = []
        for folder in sorted((self.root / "runs").iterdir()):
            run_id = folder.name
            if not RUN_ID.fullmatch(run_id) or in_use(run_id):
                continue
            if any(any((folder / kind).iterdir()) for kind in KINDS if (folder / kind).is_dir()):
                continue                        # it has checkpoints (or one being written): kept
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(run_id)
        return removed

    def delete(self, path: str, owner: str) -> None:
        folder, _ = self.folder(path, owner)
        shutil.rmtree(folder)
