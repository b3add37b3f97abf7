"""Wall time and memory of `strop quickstart` at its defaults, the README's main job, as a user runs it.

    python benchmarks/quickstart.py                                  # the defaults: SmolLM2, 16 steps, 100 items
    python benchmarks/quickstart.py --quick                          # strop/tiny-random, 2 steps, 8 items
    python benchmarks/quickstart.py -- --steps 8 --eval-n 50         # anything after -- goes to quickstart

It runs `strop quickstart` in a subprocess with a fresh --out folder, polls /proc for the resident memory of the
quickstart process and every process under it (run and evaluation workers, grader sandboxes), then reads what
quickstart wrote (quickstart.json, the run's metrics.jsonl) to split the time: training steps (sampling, training)
and the rest (model selection, both evaluations with their judge passes, tables, report). Afterwards `strop
cleanup` removes what the quickstart made. The store is $STROP_HOME's, so a converted model is reused; the first
run in a fresh home also converts SmolLM2 (about half a minute) and that counts in the wall time.

Last line: `quickstart X.X s (training Y.Y s) accuracy A% -> B%`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

STROP = [sys.executable, "-m", "strop.cli.main"]
QUICK = ["--base-model", "strop/tiny-random", "--steps", "2", "--eval-n", "8"]


def tree_rss_bytes(root: int) -> tuple[int, int]:
    """(the RSS of root and all its descendants together, the largest single one's), read from /proc."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()
            children.setdefault(int(fields[1]), []).append(int(entry))
            rss[int(entry)] = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            continue  # a process that ended while we looked
    total, largest, todo = 0, 0, [root]
    while todo:
        pid = todo.pop()
        total += rss.get(pid, 0)
        largest = max(largest, rss.get(pid, 0))
        todo.extend(children.get(pid, []))
    return total, largest


def run_measured(argv: list[str]) -> tuple[int, float, int, int]:
    """Run argv; (exit status, wall seconds, peak tree RSS, peak single-process RSS)."""
    peaks = [0, 0]
    started = time.perf_counter()
    proc = subprocess.Popen(argv)
    done = threading.Event()

    def poll():
        while not done.wait(0.5):
            total, largest = tree_rss_bytes(proc.pid)
            peaks[0], peaks[1] = max(peaks[0], total), max(peaks[1], largest)

    watcher = threading.Thread(target=poll, daemon=True)
    watcher.start()
    code = proc.wait()
    seconds = time.perf_counter() - started
    done.set()
    watcher.join()
    return code, seconds, peaks[0], peaks[1]


def main() -> int:
    cli = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_argument("--quick", action="store_true", help=f"tiny sizes: {' '.join(QUICK)}")
    cli.add_argument("--keep", action="store_true", help="keep what quickstart made (no strop cleanup)")
    cli.add_argument("extra", nargs="*", help="more quickstart flags, after --")
    args = cli.parse_args()
    out = Path(tempfile.mkdtemp(prefix="bench-quickstart-")) / "out"
    flags = (QUICK if args.quick else []) + args.extra + ["--out", str(out)]
    print(f"strop quickstart {' '.join(flags)}  (STROP_HOME={os.environ.get('STROP_HOME', '~/.strop')}, "
          f"{os.cpu_count()} CPUs)", flush=True)
    code, wall, tree_peak, single_peak = run_measured(STROP + ["quickstart", *flags])
    if code != 0:
        print(f"quickstart exited {code} after {wall:.1f} s", file=sys.stderr)
        return code
    manifest = json.loads((out / "quickstart.json").read_text())
    summary = manifest["summary"]
    from strop.paths import runs_dir
    metrics = [json.loads(line) for line in (runs_dir() / manifest["run"] / "metrics.jsonl").open()]
    training = sum(r["stepSeconds"] for r in metrics)
    sampling = sum(r["sampleSeconds"] for r in metrics)
    print(f"wall {wall:.1f} s ({int(wall // 60)} min {wall % 60:.0f} s); inside quickstart {manifest['seconds']:.1f} s")
    print(f"training: {len(metrics)} steps, {training:.1f} s ({training / len(metrics):.1f} s/step: sampling "
          f"{sampling:.1f} s, training {training - sampling:.1f} s); everything else {wall - training:.1f} s")
    print(f"peak resident memory: {tree_peak / 1e9:.2f} GB for all quickstart's processes together, "
          f"{single_peak / 1e9:.2f} GB the largest single one (polled every 0.5 s)")
    acc, mcnemar = summary["accuracy"], summary["mcnemar"]
    print(f"exact match {acc['a']:.1%} -> {acc['b']:.1%} on {summary['n']} items, McNemar p = {mcnemar['p']:.3g}")
    if not args.keep:
        subprocess.run(STROP + ["cleanup", "--out", str(out)], check=True, stdout=subprocess.DEVNULL)
    print(f"quickstart {wall:.1f} s (training {training:.1f} s) accuracy {acc['a']:.1%} -> {acc['b']:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
