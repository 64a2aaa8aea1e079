"""A small real filesystem for full-disk tests: a tmpfs the test mounts itself.

Mounting needs root (CI runs as root); elsewhere :func:`require_small_fs` skips the
test with the reason, which is the only skip these tests allow.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

MiB = 1 << 20


def can_mount() -> str | None:
    """``None`` if this process may mount a tmpfs, else why not."""
    if os.geteuid() != 0:
        return "mounting a small tmpfs needs root (CI runs as root)"
    if shutil.which("mount") is None or shutil.which("umount") is None:
        return "no mount/umount command on this machine"
    return None


def require_small_fs() -> None:
    reason = can_mount()
    if reason is not None:
        pytest.skip(f"full-disk test on a real filesystem: {reason}")


@contextlib.contextmanager
def small_fs(where: Path, size_mib: int) -> Iterator[Path]:
    """A fresh tmpfs of ``size_mib`` MiB at ``where``, unmounted afterwards."""
    where.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_mib}m,mode=0700", "tmpfs", str(where)],
        check=True,
        capture_output=True,
    )
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False, capture_output=True)


def fill(path: Path, leave: int = 0) -> int:
    """Write ``path`` until the filesystem is full (less ``leave`` bytes); its size."""
    written = 0
    chunk = b"\0" * (64 << 10)
    with path.open("wb", buffering=0) as out:
        while True:
            try:
                written += out.write(chunk)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                break
        for _ in range(512):  # the last few bytes
            try:
                written += out.write(b"\0" * 512)
            except OSError:
                break
    if leave:
        os.truncate(path, max(0, written - leave))
        written = max(0, written - leave)
    return written


def seed_by_symlink(data_dir: Path, blob_cache: Path) -> Path:
    """A data directory whose blob store points at the bundled model by symlinks, so a
    small filesystem need not hold 92 MB of it."""
    blobs = data_dir / "blobs"
    blobs.mkdir(parents=True)
    for blob in blob_cache.iterdir():
        (blobs / blob.name).symlink_to(blob)
    return data_dir
