"""Where strop keeps its state: `$STROP_HOME` (default `~/.strop`).

    models/<safe id>/   cached base-model weights (safetensors + tokenizer files)
    runs/<run name>/    one folder per training run: config, metrics.jsonl, rollouts, events, checkpoints
"""

import os
from pathlib import Path


def strop_home() -> Path:
    home = Path(os.environ.get("STROP_HOME") or Path.home() / ".strop").expanduser()
    home.mkdir(parents=True, exist_ok=True)
    return home


def models_dir() -> Path:
    path = strop_home() / "models"
    path.mkdir(parents=True, exist_ok=True)
    return path


def runs_dir() -> Path:
    path = strop_home() / "runs"
    path.mkdir(parents=True, exist_ok=True)
    return path


def safe_name(model_id: str) -> str:
    """A model id as one folder name: 'HuggingFaceTB/SmolLM2-135M-Instruct' -> 'HuggingFaceTB--SmolLM2-135M-Instruct'."""
    return model_id.strip("/").replace("/", "--")
