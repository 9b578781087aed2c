"""keep_freed_pages(): a cycle's vocabulary-sized arrays reuse the pages the last cycle freed.

Counted in minor page faults (the kernel zero-filling a fresh page on first touch), not
time: each case runs in a fresh process that allocates a sampled cycle's arrays (33 float64
vectors of a 150k vocabulary, all alive at once), frees them, and does so again."""

from __future__ import annotations

import json
import platform
import subprocess
import sys

import pytest

from specrouter import allocator
from specrouter.pool import Pool

CYCLES = """
import json, resource, sys
import numpy as np
from specrouter.allocator import keep_freed_pages
tuned = keep_freed_pages() if sys.argv[1] == "tuned" else False
faults = []
for cycle in range(6):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    rows = [np.full(151_936, 1.0) for _ in range(33)]  # touched: written once
    del rows
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"tuned": tuned, "faults": faults}))
"""
#: Pages a cycle touches: 33 vectors of 151,936 float64 (4 KiB pages).
PAGES = 33 * 151_936 * 8 // 4096

glibc = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the thresholds are glibc's")


def cycles(mode: str) -> dict:
    done = subprocess.run([sys.executable, "-c", CYCLES, mode], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@glibc
def test_later_cycles_reuse_the_pages_freed_by_earlier_ones():
    default, tuned = cycles("default"), cycles("tuned")
    assert tuned["tuned"] is True
    # By default every cycle after the first still touches fresh pages (its freed heap was
    # trimmed); tuned, the first cycle maps them and the others find them mapped.
    assert min(default["faults"][1:]) > PAGES // 2, default
    assert tuned["faults"][0] > PAGES // 2, tuned
    assert max(tuned["faults"][1:]) < PAGES // 50, tuned


def test_a_pool_sets_the_thresholds_once_per_process(monkeypatch):
    calls = []
    monkeypatch.setattr(allocator, "_done", None)  # as in a process that has not set them yet
    monkeypatch.setattr(allocator, "_set_thresholds", lambda: calls.append("set") or True)
    Pool()
    Pool()
    assert calls == ["set"]
    assert allocator.keep_freed_pages() is True
