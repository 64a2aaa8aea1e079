"""The KV cache's memory, populated before llama.cpp clears it.

Creating a context allocates its KV cache (about 22 KB a token a sequence for
SmolLM2-135M: 1.6 GB for 9 sequences of 8,192 tokens) and clears it with ``memset``.
Fresh memory is mapped a page at a time as that ``memset`` first writes it, and on this
project's two-core machines those 400,000 page faults took 1.1-2.1 s: most of an engine's
start, and so of a resume after a crash (docs/performance.md, issue 29).

:func:`populated` asks the kernel for the pages in one call instead
(``madvise(MADV_POPULATE_WRITE)``, Linux 5.14+: 0.5 s for the same 1.6 GB here; 0.29 s
with the range split between two threads, one a core, since the kernel's work of mapping
and zeroing pages runs in parallel; 0.09-0.1 s when the range is also marked for
transparent huge pages, ``MADV_HUGEPAGE``, so the kernel maps 2 MB at a time: 800
mappings instead of 400,000) and has
llama.cpp's allocation land on them: glibc is told to serve large blocks from its heap
and not to give freed memory back for the while (``mallopt``), a block of the cache's
size is taken, populated and freed, and the cache llama.cpp then allocates is carved
from those very pages, so its ``memset`` runs at memory speed. Where any of this is
missing (not glibc, an older kernel) it does nothing and the faults happen as before;
where huge pages are off (``/sys/kernel/mm/transparent_hugepage/enabled`` is ``never``)
or none is free, the kernel maps ordinary pages. (In a virtual machine whose kernel hands
free 2 MB blocks back to its host, long-free huge pages are slow to map again: an
engine's cold start now and then takes longer, its restart after a crash is faster:
docs/performance.md.)
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

log = logging.getLogger("lmsp.engine")

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_MMAP_MAX = -4
MADV_POPULATE_WRITE = 23
MADV_HUGEPAGE = 14
#: a transparent huge page on x86-64 and arm64's default granule
HUGE = 2 << 20
#: what the settings go back to: glibc's own default for the count, and the large-block
#: threshold its dynamic rule reaches after a large free (it stops adjusting once set)
MMAP_MAX_DEFAULT = 65536
MMAP_THRESHOLD_AFTER = 32 << 20
#: populated a piece at a time, so the process's other threads are not held off the
#: address space's lock for the whole call
PIECE = 64 << 20
#: smaller caches fault in little time: not worth changing the allocator for
SMALLEST = 256 << 20
#: the most threads that populate at once (one a core up to this)
THREADS = 4

_lock = threading.Lock()


def _glibc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.gnu_get_libc_version  # noqa: B018 - only glibc has it
    except (OSError, AttributeError):
        return None
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    libc.free.restype = None
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    libc.madvise.restype = ctypes.c_int
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    libc.mallopt.restype = ctypes.c_int
    libc.malloc_trim.argtypes = [ctypes.c_size_t]
    libc.malloc_trim.restype = ctypes.c_int
    return libc


def _populate(libc: ctypes.CDLL, block: int, size: int) -> bool:
    """Map every whole page of ``block`` now, the range split between one thread a core
    (up to :data:`THREADS`); ``False`` if the kernel cannot."""
    page = 4096
    start = (block + page - 1) // page * page
    end = (block + size) // page * page
    inner, outer = (block + HUGE - 1) // HUGE * HUGE, (block + size) // HUGE * HUGE
    if outer > inner:  # advice only: refused or unmet, ordinary pages are mapped
        libc.madvise(inner, outer - inner, MADV_HUGEPAGE)
    workers = max(1, min(THREADS, len(os.sched_getaffinity(0))))
    share = (end - start) // workers // page * page
    bounds = [start + i * share for i in range(workers)] + [end]
    if workers == 1:
        return _populate_range(libc, start, end)
    with ThreadPoolExecutor(workers, thread_name_prefix="lmsp-populate") as pool:
        done = pool.map(_populate_range, [libc] * workers, bounds[:-1], bounds[1:])
        return all(list(done))


def _populate_range(libc: ctypes.CDLL, start: int, end: int) -> bool:
    """Map the pages from ``start`` to ``end`` (page-aligned), a :data:`PIECE` a call."""
    while start < end:
        length = min(PIECE, end - start)
        if libc.madvise(start, length, MADV_POPULATE_WRITE) != 0:
            return False  # EINVAL before Linux 5.14: the memset faults them in instead
        start += length
    return True


@contextlib.contextmanager
def populated(size: int) -> Iterator[None]:
    """Run the body (llama.cpp creating a context whose KV cache takes about ``size``
    bytes) with that much of glibc's heap already mapped (see the module docstring)."""
    libc = _glibc() if size >= SMALLEST else None
    if libc is None:
        yield
        return
    with _lock:
        libc.mallopt(M_MMAP_MAX, 0)  # large blocks from the heap, which keeps freed pages
        libc.mallopt(M_TRIM_THRESHOLD, 2**31 - 1)
        try:
            block = libc.malloc(size)
            if block:
                try:
                    if not _populate(libc, block, size):
                        log.debug("the kernel cannot populate memory ahead; faulting it in")
                finally:
                    libc.free(block)
            yield
        finally:
            libc.mallopt(M_MMAP_MAX, MMAP_MAX_DEFAULT)
            libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_AFTER)
            libc.mallopt(M_TRIM_THRESHOLD, 2 * MMAP_THRESHOLD_AFTER)
            libc.malloc_trim(0)  # what the body did not take goes back (llama.cpp failed)
