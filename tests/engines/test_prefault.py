"""The KV cache's memory is mapped before llama.cpp clears it (engines/prefault.py).

Checked with ``mincore``: which pages of an allocation are resident. A large block taken
inside :func:`populated` is resident before anything writes it (the pages were mapped
ahead, in one call); one taken outside is fresh memory, mapped as it is first written.
Where the kernel offers transparent huge pages on request, the block inside is mapped
with them (``AnonHugePages`` of its mapping in ``/proc/self/smaps``).
"""

from __future__ import annotations

import ctypes
import mmap
from pathlib import Path

import pytest

from lmsp.engines import prefault

SIZE = 512 << 20
PAGE = mmap.PAGESIZE


def _libc() -> ctypes.CDLL:
    libc = prefault._glibc()
    if libc is None:
        pytest.fail("lmsp's engines run on Linux with glibc; this machine has neither")
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    libc.mincore.restype = ctypes.c_int
    return libc


def resident_share(libc: ctypes.CDLL, block: int, size: int) -> float:
    """The share of ``block``'s whole pages that are resident."""
    start = (block + PAGE - 1) // PAGE * PAGE
    pages = (block + size - start) // PAGE
    flags = (ctypes.c_ubyte * pages)()
    assert libc.mincore(start, pages * PAGE, flags) == 0
    return sum(f & 1 for f in flags) / pages


def kernel_populates(libc: ctypes.CDLL) -> bool:
    area = mmap.mmap(-1, PAGE)
    address = ctypes.addressof(ctypes.c_char.from_buffer(area))
    try:
        return libc.madvise(address, PAGE, prefault.MADV_POPULATE_WRITE) == 0
    finally:
        del address
        area.close()


@pytest.mark.parametrize("threads", [1, 3])
def test_a_block_taken_inside_is_already_mapped_and_one_outside_is_not(
    threads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whether one thread maps the pages or several share the range (3: shares that are
    not a power of two, the last one longer)."""
    monkeypatch.setattr(prefault, "THREADS", threads)
    monkeypatch.setattr(prefault.os, "sched_getaffinity", lambda _pid: set(range(threads)))
    libc = _libc()
    with prefault.populated(SIZE):
        inside = libc.malloc(SIZE)
        assert inside
        share_inside = resident_share(libc, inside, SIZE)
        libc.free(inside)
    outside = libc.malloc(SIZE)  # large blocks are fresh mappings again
    assert outside
    share_outside = resident_share(libc, outside, SIZE)
    libc.free(outside)
    assert share_outside < 0.01
    if kernel_populates(libc):
        assert share_inside > 0.99
    else:  # before Linux 5.14: nothing mapped ahead, nothing else changed
        assert share_inside < 0.01


def huge_bytes(block: int, size: int) -> int:
    """How much of the mappings over ``block`` is backed by transparent huge pages (the
    advice splits a mapping where it begins and ends)."""
    total, overlaps = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            low, high = (int(part, 16) for part in head.split("-"))
            overlaps = low < block + size and block < high
        elif overlaps and head == "AnonHugePages:":
            total += int(line.split()[1]) * 1024
    return total


def huge_page_mode() -> str:
    """The kernel's transparent huge pages: ``always``, ``madvise`` (on request) or
    ``never``."""
    try:
        text = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return "never"
    return text.split("[", 1)[1].split("]", 1)[0]


def test_the_block_inside_is_mapped_with_huge_pages_where_the_kernel_has_them() -> None:
    libc = _libc()
    mode = huge_page_mode()
    with prefault.populated(SIZE):
        inside = libc.malloc(SIZE)
        assert inside
        huge = huge_bytes(inside, SIZE)
        libc.free(inside)
    outside = libc.malloc(SIZE)  # a fresh mapping nobody advised, written whole
    assert outside
    ctypes.memset(outside, 1, SIZE)
    huge_outside = huge_bytes(outside, SIZE)
    libc.free(outside)
    if not kernel_populates(libc) or mode == "never":
        assert huge == 0
    else:  # most of it: not the unaligned ends, nor any the kernel found no free one for
        assert huge >= SIZE // 4
    if mode == "madvise":  # only on request: the huge pages inside were lmsp's advice
        assert huge_outside == 0


def test_small_caches_leave_the_allocator_alone() -> None:
    libc = _libc()
    with prefault.populated(prefault.SMALLEST - 1):
        block = libc.malloc(SIZE)  # not mapped ahead: the cache was too small to bother
        assert block
        share = resident_share(libc, block, SIZE)
        libc.free(block)
    assert share < 0.01
