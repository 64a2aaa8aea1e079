"""The data directory: one owner at a time, and private to the user who runs lmsp.

Every process that changes a data directory (``lmsp serve``, ``lmsp gc``, a test that
opens the service in process) first takes an exclusive lock on ``lmsp.lock`` inside it,
before it opens the database. The lock is an ``flock`` on an open descriptor: it is held
for as long as the descriptor is open and released by the kernel when the process dies,
however it dies, so a crash never leaves a stale lock behind. The file also holds the
owner's pid and command, so a refusal can say who holds the directory, and, once
``lmsp serve`` has bound its port, the address it serves on
(:meth:`DataDirLock.record_address`): the ``lmsp`` command and :class:`lmsp.Client`
find the service of a data directory there (:func:`holder`), whatever port it runs on.

The directory is created ``0700`` and every file lmsp creates in it ``0600``: they hold
every prompt and every output.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import stat
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

LOCK_NAME = "lmsp.lock"
DIR_MODE = 0o700
FILE_MODE = 0o600


class DataDirBusy(Exception):
    """Another process holds the data directory."""

    def __init__(self, data_dir: Path, holder: str) -> None:
        super().__init__(
            f"the data directory {data_dir} is in use by another lmsp process ({holder});"
            " stop it first, or use another --data-dir"
        )
        self.data_dir = data_dir
        self.holder = holder


def ensure_private_dir(path: Path) -> Path:
    """Create ``path`` (and missing parents of it) with mode ``0700``; an existing
    directory is left as it is (``lmsp doctor`` warns about a wider mode)."""
    if not path.is_dir():
        path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        os.chmod(path, DIR_MODE)  # mkdir's mode is filtered by the umask
    return path


def create_private_file(path: Path) -> None:
    """Create ``path`` empty with mode ``0600`` unless it exists. SQLite gives its
    ``-wal`` and ``-shm`` files the mode of the database file, so this covers them."""
    with contextlib.suppress(FileExistsError):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
        os.close(fd)


def wider_than_private(path: Path) -> int | None:
    """The mode of ``path`` if group or others have any access to it, else ``None``."""
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        return None
    return mode if mode & 0o077 else None


@dataclass
class DataDirLock:
    """An exclusive hold on a data directory; :meth:`release` (or process exit) ends it."""

    data_dir: Path
    fd: int | None

    @property
    def held(self) -> bool:
        return self.fd is not None

    def release(self) -> None:
        if self.fd is not None:
            fd, self.fd = self.fd, None
            os.close(fd)  # closing the descriptor drops the flock

    def record_address(self, url: str) -> None:
        """Say in the lock file where this process serves (after its pid and command),
        for :func:`holder`."""
        if self.fd is None:
            return
        first = os.pread(self.fd, 512, 0).split(b"\n", 1)[0]
        text = first + f"\n{ADDRESS_KEY} {url}\n".encode()
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, text, 0)


#: the lock file's line naming the address its holder serves on
ADDRESS_KEY = "url"


@dataclass(frozen=True)
class Holder:
    """The process holding a data directory, as its lock file says."""

    pid: str
    command: str
    url: str | None  # where it serves (``None``: not a server, or not bound yet)

    def __str__(self) -> str:
        said = f"pid {self.pid}" + (f", {self.command}" if self.command else "")
        return said + (f", on {self.url}" if self.url else "")


def _parse(text: str) -> Holder | None:
    lines = text.strip().splitlines()
    if not lines or not lines[0].strip():
        return None
    pid, _, command = lines[0].strip().partition(" ")
    url = None
    for line in lines[1:]:
        key, _, value = line.partition(" ")
        if key == ADDRESS_KEY and re.fullmatch(r"http://[^\s/]+", value.strip()):
            url = value.strip()  # what record_address writes, nothing else
    return Holder(pid, command.strip(), url)


def _holder(fd: int) -> str:
    with contextlib.suppress(OSError):
        found = _parse(os.pread(fd, 512, 0).decode("utf-8", "replace"))
        if found is not None:
            return str(found)
    return "pid unknown"


def _locked(info: os.stat_result) -> bool | None:
    """Whether a process holds an ``flock`` on the file ``info`` describes, as the
    kernel's table of locks says (``None``: no such table here). Only read, never
    locked: a test lock, however short, would make a starting ``lmsp serve`` refuse."""
    try:
        table = Path("/proc/locks").read_text()
    except OSError:
        return None
    for line in table.splitlines():
        fields = line.split()
        if len(fields) < 6 or fields[1] != "FLOCK":
            continue
        try:
            major, minor, inode = fields[5].split(":")
            device = os.makedev(int(major, 16), int(minor, 16))
        except ValueError:
            continue
        if int(inode) == info.st_ino and device == info.st_dev:
            return True
    return False


def _alive(pid: str) -> bool:
    try:
        os.kill(int(pid), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True


def holder(data_dir: Path) -> Holder | None:
    """The process that holds ``data_dir`` now (``lmsp serve``, ``lmsp gc``), or
    ``None`` when none does. Read without taking the lock."""
    path = data_dir / LOCK_NAME
    try:
        with path.open("rb") as f:
            info = os.fstat(f.fileno())
            text = f.read(512).decode("utf-8", "replace")
    except OSError:
        return None
    found = _parse(text)
    if found is None:
        return None
    held = _locked(info)
    if held is None:  # no table of locks: a live pid is the best evidence there is
        held = _alive(found.pid)
    return found if held else None


def acquire(
    data_dir: Path, command: str | None = None, waiting: Callable[[str], None] | None = None
) -> DataDirLock:
    """Take the data directory's lock, creating the directory (``0700``) if needed.

    Raises :class:`DataDirBusy` at once when another process holds it, unless
    ``waiting`` is given: then it is called with the holder's description and the lock
    is awaited (a standby: the kernel hands it over the moment the holder dies).
    """
    ensure_private_dir(data_dir)
    path = data_dir / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        busy = exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)
        if not busy or waiting is None:
            holder = _holder(fd)
            os.close(fd)
            if busy:
                raise DataDirBusy(data_dir, holder) from None
            raise
        try:
            waiting(_holder(fd))
            fcntl.flock(fd, fcntl.LOCK_EX)
        except BaseException:
            os.close(fd)
            raise
    what = command if command is not None else " ".join(Path(a).name for a in sys.argv[:2])
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()} {what}\n".encode(), 0)
    return DataDirLock(data_dir, fd)
