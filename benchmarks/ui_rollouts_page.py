"""How long `strop ui` takes to open a page of a large run's rollouts: a generated rollouts.jsonl of STEPS x
PER_STEP rows (text of a realistic size), a store run that owns it, and the real HTTP server on loopback.

    PYTHONPATH=src python benchmarks/ui_rollouts_page.py --steps 1000 --per-step 100 [--browser]

Prints the file's size, the first page (which builds the byte-offset index and keeps it on disk), later pages of other steps, the
next page after a step's first, a text search over one step, and the steps list, each in milliseconds. With
--browser, also how long headless Chromium takes from opening the rollout browser of a fresh server to showing
its first page of samples: with nothing cached, and with the index an earlier server kept on disk.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
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
    parser.add_argument("--browser", action="store_true", help="also time the page in headless Chromium")
    args = parser.parse_args()
    home = tempfile.TemporaryDirectory(prefix="strop-ui-bench-")     # the generated run is 100+ MB: removed after
    os.environ["STROP_HOME"] = home.name
    try:
        measure(args)
    finally:
        home.cleanup()


def measure(args) -> None:
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
    if args.browser:
        from strop.paths import strop_home
        import strop.ui.rollouts as rollouts
        for cold in (True, False):
            rollouts._INDEXES.clear()             # a fresh server process: nothing in memory
            if cold:
                shutil.rmtree(strop_home() / "ui-cache", ignore_errors=True)
            browser_open(run_id, "nothing cached" if cold else "index cached on disk by an earlier server",
                         args.steps - 1)


def browser_open(run_id: str, label: str, last_step: int) -> None:
    from chromium_cdp import Chromium                    # the tests' DevTools driver
    from ui_runs import ui_server
    with ui_server() as server, Chromium() as browser:
        page = browser.page(f"http://127.0.0.1:{server.server_port}/")     # the app loaded, no rollouts asked yet
        t0 = time.perf_counter()
        page.evaluate(f"location.hash = '#/run/{run_id}/rollouts'")
        page.wait_for("document.querySelectorAll('.sample').length >= 40", timeout_s=60)
        print(f"Chromium, fresh server ({label}): rollout browser to its first 40 samples shown: "
              f"{(time.perf_counter() - t0) * 1000:.0f} ms")
        t0 = time.perf_counter()
        page.evaluate(f"document.getElementById('step').value = '{last_step}'; "
                      "document.getElementById('step').onchange()")
        page.wait_for("document.querySelector('.sample') && document.querySelector('.group').dataset.group"
                      f".startsWith('{last_step}/')", timeout_s=60)
        print(f"Chromium: another step's page shown: {(time.perf_counter() - t0) * 1000:.0f} ms")


if __name__ == "__main__":
    main()
