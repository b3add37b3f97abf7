"""examples/gsm8k/walkthrough.sh, seed 003 step by step, runs end to end with tiny sizes."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GSM8K = Path(os.environ.get("STROP_GSM8K_DIR") or ROOT.parent / "shared" / "data" / "gsm8k")


@pytest.mark.skipif(not (GSM8K / "train.jsonl").exists(), reason="GSM8K copy for tests not present")
def test_walkthrough_on_tiny_random(tmp_path):
    env = {**os.environ, "STROP_HOME": str(tmp_path / "home"), "ROWS": "8", "EVAL_ROWS": "4", "MAX_STEPS": "2",
           "GROUP_SIZE": "2", "MAX_COMPLETION_LENGTH": "8", "BASE_MODEL": "strop/tiny-random",
           "DATA_DIR": str(tmp_path / "data"), "GSM8K_FROM": str(GSM8K),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("STROP_DATABASE_URL", None)
    proc = subprocess.run(["bash", str(ROOT / "examples" / "gsm8k" / "walkthrough.sh")], env=env, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "gsm8k/train@1 registered" in out and "gsm8k/scoring@1 registered" in out
    assert "descriptor is valid and admissible" in out and "status: succeeded" in out
    assert "STEP  ZERO-VAR  REWARD" in out and "n: 4" in out
    # a second pass finds everything registered and the project there, and still succeeds
    again = subprocess.run(["bash", str(ROOT / "examples" / "gsm8k" / "walkthrough.sh")], env=env, capture_output=True,
                           text=True, timeout=900)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "gsm8k/train@1 unchanged" in again.stdout
