"""examples/tinker_loop_gsm8k.py, seed 000's loop ported by its imports, runs as a user would run it."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def gsm8k_dir() -> Path:
    return Path(os.environ.get("STROP_GSM8K_DIR") or ROOT.parent / "shared" / "data" / "gsm8k")


@pytest.mark.skipif(not (gsm8k_dir() / "test.jsonl").exists(), reason="GSM8K copy for tests not present")
def test_seed_loop_runs_on_tiny_random():
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "tinker_loop_gsm8k.py"), "--data-dir", str(gsm8k_dir()),
                           "--steps", "2", "--batch-size", "2", "--group-size", "2", "--max-tokens", "8", "--eval-n", "10"],
                          capture_output=True, text=True, timeout=600, env=os.environ.copy())
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "Train: 7473 | Eval: 10" in out
    assert "Step   0 |" in out and "Step   1 |" in out and "Training complete" in out
    assert "[10/10] running accuracy" in out and "Fine-tuned strop/tiny-random accuracy" in out
