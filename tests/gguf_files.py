"""Model files for tests, derived from the bundled GGUF (never modifying it or a blob
that might be a hard link to it)."""

from __future__ import annotations

import os
from pathlib import Path

from lmsp.bootstrap import bundled_model_path

NAME = b"Smollm2 135M"


def variant(dest: Path, tag: bytes = b"X") -> Path:
    """A valid, loadable copy with one byte of its ``general.name`` changed: the same
    weights under a different digest (its own blob)."""
    data = bytearray(bundled_model_path().read_bytes())
    at = data.index(NAME) + len(NAME) - 1
    data[at : at + 1] = tag
    dest.write_bytes(bytes(data))
    return dest


def unknown_architecture(dest: Path) -> Path:
    """A whole GGUF whose ``general.architecture`` is one llama.cpp does not know: it
    imports, and fails to load."""
    data = bytearray(bundled_model_path().read_bytes())
    key = b"general.architecture"
    at = data.index(key) + len(key) + 4 + 8  # the value type, then the string length
    assert data[at : at + 5] == b"llama"
    data[at : at + 5] = b"lxama"
    dest.write_bytes(bytes(data))
    return dest


def truncated(dest: Path, size: int = 4 << 20) -> Path:
    """A GGUF whose header is intact but whose tensor data is cut off."""
    with bundled_model_path().open("rb") as src:
        dest.write_bytes(src.read(size))
    return dest


def flip_byte(path: Path, offset_from_end: int = 4096) -> None:
    """Corrupt a file without changing its size, by writing a new file over it (a blob
    may share its inode with other data directories through a hard link)."""
    data = bytearray(path.read_bytes())
    data[-offset_from_end] ^= 0xFF
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(bytes(data))
    os.replace(tmp, path)


def with_pooling(dest: Path, pooling: int) -> Path:
    """A whole, loadable copy with one more key, ``llama.pooling_type`` (4: a reranker's
    ``rank``): the header grows, the tensor data moves to the next aligned offset."""
    import struct

    from lmsp.gguf import DEFAULT_ALIGNMENT, check_structure, read_header

    source = bundled_model_path()
    data = source.read_bytes()
    header = read_header(source)
    alignment = int(header.get("general.alignment", DEFAULT_ALIGNMENT))
    with source.open("rb") as fh:  # where the keys end: re-read them, up to the tensor table
        from lmsp.gguf import _header

        _header(fh)
        keys_end = fh.tell()
        check_structure(fh, len(data))
        table_end = fh.tell()
    data_start = (table_end + alignment - 1) // alignment * alignment
    key = b"llama.pooling_type"
    added = struct.pack("<Q", len(key)) + key + struct.pack("<II", 4, pooling)  # uint32
    (count,) = struct.unpack_from("<Q", data, 16)
    head = data[:16] + struct.pack("<Q", count + 1) + data[24:keys_end] + added
    head += data[keys_end:table_end]
    head += b"\0" * (-len(head) % alignment)
    dest.write_bytes(head + data[data_start:])
    return dest
