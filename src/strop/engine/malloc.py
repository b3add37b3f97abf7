"""Keep freed memory in the process instead of handing it back to the kernel.

glibc serves big allocations with fresh mmap'd pages and returns them on free, so every forward pass faults
its activations in again, page by page. On a bare machine that costs little; inside a virtual machine
(Firecracker and friends) each fault is an exit to the hypervisor, and we measured decode steps of SmolLM2 at
batch 64 taking 7.8 s instead of 0.27 s. Raising the mmap and trim thresholds lets malloc reuse its heap.
The same settings are what MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_ / MALLOC_TOP_PAD_ do from the
environment; mallopt applies them after start-up. No effect (and no error) off glibc.
"""

import ctypes
import ctypes.util
import sys

M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD, M_MMAP_MAX = -1, -2, -3, -4
_done = False


def keep_freed_memory() -> bool:
    global _done
    if _done or not sys.platform.startswith("linux"):
        return _done
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        ok = libc.mallopt(M_MMAP_THRESHOLD, 32 * 1024 * 1024)   # glibc's largest allowed value
        # ...and past that threshold (logits of a batch are hundreds of MB) use the heap too, never mmap
        ok &= libc.mallopt(M_MMAP_MAX, 0)
        ok &= libc.mallopt(M_TRIM_THRESHOLD, 2**31 - 1)
        ok &= libc.mallopt(M_TOP_PAD, 256 * 1024 * 1024)
        _done = bool(ok)
    except (OSError, AttributeError):
        _done = False
    return _done


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                     "fsmblks", "uordblks", "fordblks", "keepcost")]


def kept_free_bytes() -> int:
    """Bytes this process has freed but keeps in its heap (glibc's mallinfo2 fordblks): with the settings above
    they are never handed back, so the kernel's MemAvailable does not count them, yet the next allocation reuses
    them. 0 where it cannot be read (not glibc, or glibc before 2.33)."""
    if not sys.platform.startswith("linux"):
        return 0
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallinfo2 = libc.mallinfo2
    except (OSError, AttributeError):
        return 0
    mallinfo2.restype = _MallInfo2
    return int(mallinfo2().fordblks)


def release_freed_memory() -> int:
    """Hand the memory this process freed and keeps back to the kernel (glibc's malloc_trim), once: between the
    steps of a long run, so that what the heap kept through one step (fragments of activations, of caches of
    keys and values, of logits of another size) does not add up over the run, and another process on the machine
    can use it. The next forward pass faults its pages in once, not on every pass as without the settings above.
    The bytes the heap held free before, 0 where there is no glibc to ask."""
    if not sys.platform.startswith("linux"):
        return 0
    kept = kept_free_bytes()
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim(0)
    except (OSError, AttributeError):
        return 0
    return kept
