"""How long `strop ui` takes to open a page of a large run's rollouts: a generated rollouts.jsonl of STEPS x
PER_STEP rows (text of a realistic size), a store run that owns it, and the real HTTP server on loopback.

    PYTHONPATH=src python benchmarks/ui_rollouts_page.py --steps 1000 --per-step 100

Prints the file's size, the first page (which builds the byte-offset index), later pages of other steps, the
next page after a step's first, a text search over one step, and the steps list, each in milliseconds.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
import urllib.request
from pathlib import Path


def write_rollouts(path: Path, steps: int, per_step: int, group_size: int = 8) -> None:
    rng = random.Random(0)
    words = "the revenue grew by percent from fiscal year to cash flow statement answer".split()
    with open(path, "w") as f:
        for step in range(steps):
            for i in range(per_step):
                text = " ".join(rng.choice(words) for _ in range(150))      # ~1 kB of completion
                reward = float(rng.random() < 0.4)
                f.write(json.dumps({"step": step, "group": i // group_size, "reward": reward,
                                    "advantage": reward - 0.4, "prompt": f"question {step}/{i // group_size}: " +
                                    " ".join(rng.choice(words) for _ in range(40)), "question": "q", "gold": "1",
                                    "completion": text, "scores": {"correct": reward, "format": 0.1}, "tokens": 150,
                                    "stop_reason": "stop", "errors": []}) + "\n")


def timed_get(url: str) -> tuple[float, dict]:
    t0 = time.perf_counter()
    with urllib.request.urlopen(url) as response:
        body = json.loads(response.read())
    return (time.perf_counter() - t0) * 1000, body


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--per-step", type=int, default=100)
    args = parser.parse_args()
    os.environ["STROP_HOME"] = tempfile.mkdtemp(prefix="strop-ui-bench-")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from ui_runs import make_run, ui_server              # the tests' run records: a real store row and folder
    from strop.control.runs import run_dir
    run_id = make_run("bench", steps=args.steps, max_steps=args.steps)
    path = run_dir(run_id) / "rollouts.jsonl"
    write_rollouts(path, args.steps, args.per_step)
    print(f"{args.steps * args.per_step:,} rollouts, {path.stat().st_size / 1e6:.0f} MB")
    with ui_server() as server:
        base = f"http://127.0.0.1:{server.server_port}/api/runs/{run_id}"
        ms, body = timed_get(f"{base}/rollouts?step=0&limit=40")
        print(f"first page (builds the index): {ms:.0f} ms, {len(body['rows'])} rows of {body['total']:,}")
        for step in (args.steps // 2, args.steps - 1):
            ms, body = timed_get(f"{base}/rollouts?step={step}&limit=40")
            print(f"page of step {step}: {ms:.0f} ms, {len(body['rows'])} of {body['matched']} matching")
        ms, body = timed_get(f"{base}/rollouts?step={args.steps // 2}&offset=40&limit=40")
        print(f"next page of that step: {ms:.0f} ms")
        ms, body = timed_get(f"{base}/rollouts?step={args.steps - 1}&q=revenue%20grew&limit=40")
        print(f"text search in one step: {ms:.0f} ms, {len(body['rows'])} found")
        ms, body = timed_get(f"{base}/steps")
        print(f"steps list: {ms:.0f} ms, {len(body['steps'])} steps")


if __name__ == "__main__":
    main()
