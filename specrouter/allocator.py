"""Keeping freed memory mapped: the process's allocator told not to hand a cycle's arrays back.

Every cycle allocates vocabulary-sized arrays and frees them at its end: a model's logits
(rows x vocab float32: 10 MB for 17 rows of a 150k vocabulary) and, when sampling, one
float64 probability vector per drafted or verified position (1.2 MB each: a 16-token draft
and its verification keep 33 of them). glibc serves blocks this size from mmap, or, once its
dynamic threshold has risen, from the heap, whose free top it trims (returns to the kernel)
past twice that threshold. Either way every cycle touches fresh pages, and the kernel
zero-fills each one on first touch (a minor page fault): that, not the arithmetic, is most
of the host work of a sampled cycle under glibc's default settings (docs/simulation.md).

keep_freed_pages() sets glibc's thresholds so that blocks up to MMAP_THRESHOLD come from the
heap and up to TRIM_THRESHOLD of freed heap stays mapped: the next cycle reuses the pages the
last one freed. What stays mapped is what a cycle used at its peak (it will again); nothing
is allocated ahead. The settings are process-wide, so the process that serves (a Pool's
owner) sets them; they change speed only, never a value. Elsewhere than glibc (macOS,
musl) nothing is changed.
"""

from __future__ import annotations

import ctypes
import ctypes.util

#: mallopt's parameters (glibc's malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
#: Blocks up to this size come from the heap (HEAP_MAX_SIZE / 2: the most some glibc versions accept on 64-bit).
MMAP_THRESHOLD = 32 << 20
#: Freed heap up to this size stays mapped.
TRIM_THRESHOLD = 1 << 30

_done: bool | None = None


def keep_freed_pages() -> bool:
    """Set the thresholds once per process; whether they are set (False: not glibc, or refused)."""
    global _done
    if _done is None:
        _done = _set_thresholds()
    return _done


def _set_thresholds() -> bool:
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        libc.gnu_get_libc_version  # only glibc has it (and mallopt with these meanings)
    except (OSError, AttributeError):
        return False
    # Both are set: setting either one switches glibc's dynamic adjustment of both off.
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
