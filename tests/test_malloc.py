"""strop keeps the memory it frees (strop.engine.malloc: a forward pass reuses its heap rather than faulting
pages in again), and hands it back between a run's steps: measured on this process's own resident memory, in a
subprocess so that the allocator settings are its own."""

import json
import subprocess
import sys

PROGRAM = """
import json
import torch
from strop.engine.malloc import keep_freed_memory, kept_free_bytes, release_freed_memory
from strop.engine.resources import resident_bytes
assert keep_freed_memory()
before = resident_bytes()
blocks = [torch.ones(64 << 20, dtype=torch.uint8) for _ in range(16)]   # 1 GiB in 64 MiB blocks, touched
del blocks
kept, held = kept_free_bytes(), resident_bytes()
released = release_freed_memory()
print(json.dumps({"before": before, "held": held, "kept": kept, "released": released, "after": resident_bytes(),
                  "keptAfter": kept_free_bytes()}))
"""


def test_freed_memory_is_kept_through_a_step_and_handed_back_after_it():
    done = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    m = json.loads(done.stdout.splitlines()[-1])
    gib = 1 << 30
    assert m["held"] - m["before"] > 0.9 * gib and m["kept"] > 0.9 * gib   # freed, yet resident: kept for reuse
    assert m["released"] > 0.9 * gib
    assert m["held"] - m["after"] > 0.9 * gib                               # handed back to the kernel
    assert m["keptAfter"] < m["kept"]
