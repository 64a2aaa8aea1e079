"""The durable prefix cache's file format: one entry's header, its key and directory names.

An entry (see :mod:`lmsp.engines.kvfiles` for where they live and how they are kept),
all integers little-endian::

    magic          8 bytes   b"LMSPKV\\r\\n"
    version        u32       1
    digest         u16 length + UTF-8   the model digest, checked on every read
    tag            u16 length + UTF-8   the engine's state format
    n_tokens       u32
    tokens         n_tokens x i32
    payload_len    u64
    payload_sha256 32 bytes
    payload        payload_len bytes
"""

from __future__ import annotations

import hashlib
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, BinaryIO

if TYPE_CHECKING:
    pass


MAGIC = b"LMSPKV\r\n"
VERSION = 1
SUFFIX = ".kv"

FIXED = struct.Struct("<8sIH")  # magic, version, digest length
U16 = struct.Struct("<H")
U32 = struct.Struct("<I")
TAIL = struct.Struct("<Q32s")  # payload length, payload SHA-256
KEY = re.compile(r"^[0-9a-f]{64}$")
PLAIN_DIGEST = re.compile(r"^([a-z0-9]+):([0-9a-f]+)$")


class Corrupt(Exception):
    """A cache file that is not exactly what ``save`` wrote."""


@dataclass
class Header:
    digest: str
    tag: str
    n_tokens: int
    size: int  # bytes before the tokens


def token_bytes(tokens: Sequence[int]) -> bytes:
    """The tokens as int32 little-endian: what keys hash and headers hold."""
    import numpy as np

    return np.asarray(tokens, dtype="<i4").tobytes()


def prefix_key(tokens: Sequence[int]) -> str:
    """The file key of a token prefix: SHA-256 of its int32 LE bytes, in hex."""
    return hashlib.sha256(token_bytes(tokens)).hexdigest()


def dir_name(model_digest: str) -> str:
    """A directory name for a digest: ``sha256:ab…`` → ``sha256-ab…``; anything else
    (never a path) → a hash of it (the header still holds, and is checked against, the
    digest itself)."""
    if match := PLAIN_DIGEST.match(model_digest):
        return f"{match.group(1)}-{match.group(2)}"
    return "x-" + hashlib.sha256(model_digest.encode()).hexdigest()


def encode_header(model_digest: str, tag: str, raw_tokens: bytes, payload: bytes) -> bytes:
    digest = model_digest.encode()
    tag_b = tag.encode()
    return b"".join(
        (
            FIXED.pack(MAGIC, VERSION, len(digest)),
            digest,
            U16.pack(len(tag_b)),
            tag_b,
            U32.pack(len(raw_tokens) // 4),
            raw_tokens,
            TAIL.pack(len(payload), hashlib.sha256(payload).digest()),
        )
    )


def exactly(f: BinaryIO, n: int) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise Corrupt("truncated")
    return data


def read_header(f: BinaryIO) -> Header:
    """The fields up to the tokens (``f`` is left at the first token)."""
    magic, version, digest_len = FIXED.unpack(exactly(f, FIXED.size))
    if magic != MAGIC:
        raise Corrupt("bad magic")
    if version != VERSION:
        raise Corrupt(f"format version {version}")
    try:
        digest = exactly(f, digest_len).decode()
        (tag_len,) = U16.unpack(exactly(f, U16.size))
        tag = exactly(f, tag_len).decode()
    except UnicodeDecodeError as exc:
        raise Corrupt("garbled header") from exc
    (n_tokens,) = U32.unpack(exactly(f, U32.size))
    size = FIXED.size + digest_len + U16.size + tag_len + U32.size
    return Header(digest, tag, n_tokens, size)
