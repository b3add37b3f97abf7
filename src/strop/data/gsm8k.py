"""GSM8K from the Hugging Face hub: where its files live, and fetching one split.

GSM8K (`openai/gsm8k`, config `main`) is 7,473 train and 1,319 test grade-school word problems whose answers end
in `#### N`. `fetch_split` returns the local path of a split's parquet file, downloading it into the
huggingface_hub cache the first time; `load_rows("gsm8k")` reads it.

    >>> from strop.data.gsm8k import fetch_split
    >>> fetch_split("test")        # PosixPath('~/.cache/huggingface/hub/datasets--openai--gsm8k/.../test-...parquet')

Without network access and without a cached copy it fails within seconds (rather than after the hub client's
retries) and says to pass a local file instead.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from urllib.parse import urlparse

from strop.errors import DatasetError

HUB_REPO = "openai/gsm8k"
CONFIG = "main"
SPLIT_FILES = {
    "train": f"{CONFIG}/train-00000-of-00001.parquet",
    "test": f"{CONFIG}/test-00000-of-00001.parquet",
}
SPLIT_SIZES = {"train": 7473, "test": 1319}
PROBE_TIMEOUT_S = 3.0

_LOCAL_HINT = ("pass a local copy instead, e.g. --dataset path/to/test.jsonl "
               "(one {\"question\": ..., \"answer\": ...} object per line)")


class GSM8KUnavailable(DatasetError):
    """GSM8K could not be had from the hub; `reason` says why, without the hint (callers with other flags
    give their own)."""

    def __init__(self, reason: str):
        self.reason = reason
        super().__init__(f"{reason}; {_LOCAL_HINT}.")


def fetch_split(split: str) -> Path:
    """Local path of GSM8K's `split` ("train" or "test") parquet file, from the cache or the hub."""
    if split not in SPLIT_FILES:
        raise DatasetError(f"GSM8K has splits 'train' and 'test', got split={split!r}.")
    try:
        # lazy: optional, its absence is handled here
        from huggingface_hub import constants, hf_hub_download
    except ImportError:
        raise GSM8KUnavailable("fetching GSM8K needs huggingface_hub (`pip install huggingface_hub`)") from None

    filename = SPLIT_FILES[split]
    try:
        return Path(hf_hub_download(HUB_REPO, filename, repo_type="dataset", local_files_only=True))
    except Exception:  # not cached yet: fall through to the network
        pass

    if getattr(constants, "HF_HUB_OFFLINE", False):
        raise GSM8KUnavailable(f"GSM8K {split} split is not cached and HF_HUB_OFFLINE is set")
    endpoint = getattr(constants, "ENDPOINT", "https://huggingface.co")
    problem = _unreachable(endpoint)
    if problem:
        raise GSM8KUnavailable(f"cannot download GSM8K: the hub at {endpoint} is unreachable ({problem})")
    try:
        return Path(hf_hub_download(HUB_REPO, filename, repo_type="dataset"))
    except Exception as e:  # the hub client raises many types (HTTP, auth, disk); all mean the same to a user
        raise GSM8KUnavailable(f"cannot download GSM8K {split} split from {HUB_REPO}: {type(e).__name__}: {e}") \
            from None


def _unreachable(endpoint: str) -> str | None:
    """Why the hub cannot be reached, or None. A quick TCP probe, because the hub client retries for ~20 s."""
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return None  # the proxy decides what is reachable; let the hub client try
    url = urlparse(endpoint)
    host = url.hostname or "huggingface.co"
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S):
            return None
    except OSError as e:
        return f"{host}:{port}: {e.strerror or e}"
