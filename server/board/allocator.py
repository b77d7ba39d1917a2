"""glibc's allocator told to reuse the daemon's large buffers instead of mapping fresh pages for each.

Every received chunk (4 MiB) and every large tensor is a new allocation. glibc serves those over its
mmap threshold with a fresh mapping, and hands the top of a heap back to the kernel once more than
its trim threshold is free there, so the daemon faulted in and zeroed new pages for about every byte
it received (profiled here: a seventh of its CPU during an upload, ~0.2 CPU-seconds per GiB). With
these settings buffers up to `MMAP_THRESHOLD` come from the heaps, whose tops keep up to
`TRIM_THRESHOLD` free for the next ones, and the daemon's threads share `ARENAS` heap (with one per
thread, each keeping free memory of its own, the daemon grew by 78-106 MiB over its first uploads
here; with two, 54-69 MiB; with one, 46-52 MiB, for the same CPU: small allocations do not take the
heap's lock, each thread has a cache of its own for them). Elsewhere (another C library; 32-bit glibc, whose heaps are too
small for the threshold) nothing changes and `reuse_large_buffers` says so.
"""

from __future__ import annotations

import ctypes

# mallopt's parameter numbers (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
MMAP_THRESHOLD = 16 << 20  # above a chunk message (4 MiB) and the largest message taken (8 MiB)
TRIM_THRESHOLD = 32 << 20  # the most a heap keeps free for reuse
ARENAS = 1


def reuse_large_buffers() -> bool:
    """Set the thresholds in this process (before its threads start); whether the C library took them."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    settings = (
        (_M_MMAP_THRESHOLD, MMAP_THRESHOLD),
        (_M_TRIM_THRESHOLD, TRIM_THRESHOLD),
        (_M_ARENA_MAX, ARENAS),
    )
    return all([bool(mallopt(param, value)) for param, value in settings])
