"""A small pure reader of GGUF files: is a file GGUF, what does it say it is, and is
it whole.

Only the key/value metadata at the head of the file is read (arrays such as the
vocabulary are skipped, not loaded), so checking a multi-gigabyte model costs a few
milliseconds and never hands a malformed file to llama.cpp. :func:`check_structure`
also reads the tensor table and checks that every tensor's data lies inside the file
(a truncated copy fails it). :func:`vocabulary_only` writes a file's metadata alone as a
GGUF without tensors (a remote model's tokenizer fetched from the hub).
"""

from __future__ import annotations

import io
import struct
from pathlib import Path
from typing import Any, BinaryIO

MAGIC = b"GGUF"
MAX_STRING = 1 << 24  # a header string longer than 16 MiB means a damaged file
MAX_KEYS = 1 << 16

# value types of the GGUF specification
_SCALARS: dict[int, str] = {
    0: "<B",  # uint8
    1: "<b",  # int8
    2: "<H",  # uint16
    3: "<h",  # int16
    4: "<I",  # uint32
    5: "<i",  # int32
    6: "<f",  # float32
    7: "<?",  # bool
    10: "<Q",  # uint64
    11: "<q",  # int64
    12: "<d",  # float64
}
_STRING, _ARRAY = 8, 9
MAX_TENSORS = 1 << 20
MAX_DIMS = 4
DEFAULT_ALIGNMENT = 32

# ggml tensor types: (elements per block, bytes per block), from the GGUF specification
# and ggml's type traits; a type missing here is refused rather than guessed
TENSOR_TYPES: dict[int, tuple[int, int]] = {
    0: (1, 4),  # F32
    1: (1, 2),  # F16
    2: (32, 18),  # Q4_0
    3: (32, 20),  # Q4_1
    6: (32, 22),  # Q5_0
    7: (32, 24),  # Q5_1
    8: (32, 34),  # Q8_0
    9: (32, 40),  # Q8_1
    10: (256, 84),  # Q2_K
    11: (256, 110),  # Q3_K
    12: (256, 144),  # Q4_K
    13: (256, 176),  # Q5_K
    14: (256, 210),  # Q6_K
    15: (256, 292),  # Q8_K
    16: (256, 66),  # IQ2_XXS
    17: (256, 74),  # IQ2_XS
    18: (256, 98),  # IQ3_XXS
    19: (256, 50),  # IQ1_S
    20: (32, 18),  # IQ4_NL
    21: (256, 110),  # IQ3_S
    22: (256, 82),  # IQ2_S
    23: (256, 136),  # IQ4_XS
    24: (1, 1),  # I8
    25: (1, 2),  # I16
    26: (1, 4),  # I32
    27: (1, 8),  # I64
    28: (1, 8),  # F64
    29: (256, 56),  # IQ1_M
    30: (1, 2),  # BF16
    34: (256, 54),  # TQ1_0
    35: (256, 66),  # TQ2_0
    39: (32, 17),  # MXFP4
}


class NotGGUF(ValueError):
    """The file is not a GGUF model (or its header is damaged)."""


class HeaderShort(NotGGUF):
    """The bytes end before the header does (a truncated file, or a head being read)."""


def _read(fh: BinaryIO, size: int) -> bytes:
    data = fh.read(size)
    if len(data) != size:
        raise HeaderShort("the GGUF header ends early")
    return data


def _unpack(fh: BinaryIO, fmt: str) -> Any:
    return struct.unpack(fmt, _read(fh, struct.calcsize(fmt)))[0]


def _string(fh: BinaryIO) -> str:
    length = int(_unpack(fh, "<Q"))
    if length > MAX_STRING:
        raise NotGGUF("a GGUF header string is implausibly long")
    return _read(fh, length).decode("utf-8", errors="replace")


_LENGTH = struct.Struct("<Q")
_BLOCK = 1 << 16


def _skip_strings(fh: BinaryIO, count: int) -> None:
    """Skip an array of ``count`` strings (a vocabulary and its merges: ~100k) from
    blocks read at once, not two calls on the file per string (that took ~35 ms)."""
    block, pos = b"", 0
    unpack = _LENGTH.unpack_from
    for _ in range(count):
        if pos + 8 > len(block):
            block, pos = block[pos:] + fh.read(_BLOCK), 0
            if len(block) < 8:
                raise HeaderShort("the GGUF header ends early")
        length = int(unpack(block, pos)[0])
        if length > MAX_STRING:
            raise NotGGUF("a GGUF header string is implausibly long")
        pos += 8 + length
        if pos > len(block):  # the string runs past the block: skip the rest of it
            fh.seek(pos - len(block), 1)
            block, pos = b"", 0
    fh.seek(pos - len(block), 1)  # give back what was read past the array


def _value(fh: BinaryIO, kind: int) -> Any:
    if kind in _SCALARS:
        return _unpack(fh, _SCALARS[kind])
    if kind == _STRING:
        return _string(fh)
    if kind == _ARRAY:
        item_kind = int(_unpack(fh, "<I"))
        count = int(_unpack(fh, "<Q"))
        if item_kind in _SCALARS:  # skip fixed-size items without reading them
            fh.seek(count * struct.calcsize(_SCALARS[item_kind]), 1)
        elif item_kind == _STRING:
            _skip_strings(fh, count)
        else:
            raise NotGGUF(f"unsupported GGUF array item type {item_kind}")
        return {"array_of": item_kind, "length": count}
    raise NotGGUF(f"unknown GGUF value type {kind}")


def _header(fh: BinaryIO) -> dict[str, Any]:
    if fh.read(4) != MAGIC:
        raise NotGGUF("the file does not start with the GGUF magic")
    version = int(_unpack(fh, "<I"))
    if version not in (2, 3):
        raise NotGGUF(f"unsupported GGUF version {version}")
    tensors = int(_unpack(fh, "<Q"))
    count = int(_unpack(fh, "<Q"))
    if count > MAX_KEYS:
        raise NotGGUF("the GGUF header has implausibly many keys")
    if tensors > MAX_TENSORS:
        raise NotGGUF("the GGUF header has implausibly many tensors")
    values: dict[str, Any] = {"gguf.version": version, "gguf.tensor_count": tensors}
    for _ in range(count):
        key = _string(fh)
        values[key] = _value(fh, int(_unpack(fh, "<I")))
    return values


def read_header_from(fh: BinaryIO) -> dict[str, Any]:
    """The key/value metadata of an open GGUF file, read from its start."""
    try:
        fh.seek(0)
        return _header(fh)
    except (OSError, struct.error, OverflowError) as exc:
        raise NotGGUF(f"the GGUF header cannot be read: {exc}") from exc


def metadata_end(head: bytes) -> tuple[dict[str, Any], int] | None:
    """The key/value metadata of a GGUF file's first bytes ``head``, and where it ends
    (the tensor table follows); ``None`` when ``head`` ends before it does."""
    fh = io.BytesIO(head)
    try:
        values = _header(fh)
    except HeaderShort:
        return None
    except (struct.error, OverflowError) as exc:
        raise NotGGUF(f"the GGUF header cannot be read: {exc}") from exc
    end = fh.tell()
    return (values, end) if end <= len(head) else None  # an array skipped past the end


def vocabulary_only(head: bytes, end: int, alignment: int = DEFAULT_ALIGNMENT) -> bytes:
    """A GGUF file with the metadata of ``head[:end]`` (:func:`metadata_end`) and no
    tensor: a model's vocabulary without its weights, as llama.cpp ships its test
    vocabularies, which its tokenizer loads."""
    body = head[:8] + struct.pack("<Q", 0) + head[16:end]  # magic, version, 0 tensors, …
    return body + b"\0" * (-len(body) % alignment)


def read_header(path: Path) -> dict[str, Any]:
    """The key/value metadata of a GGUF file (arrays summarised); :class:`NotGGUF` if
    the file is not one."""
    try:
        with path.open("rb") as fh:
            return _header(fh)
    except (OSError, struct.error, OverflowError) as exc:
        if isinstance(exc, IsADirectoryError | PermissionError | FileNotFoundError):
            raise
        raise NotGGUF(f"the GGUF header cannot be read: {exc}") from exc


def check_structure(fh: BinaryIO, size: int) -> dict[str, Any]:
    """Read the whole GGUF layout of an open file of ``size`` bytes: the header, the
    tensor table, and that every tensor's data lies inside the file. Returns the header;
    :class:`NotGGUF` says what is wrong (a truncated file fails here)."""
    try:
        fh.seek(0)
        header = _header(fh)
        alignment = header.get("general.alignment", DEFAULT_ALIGNMENT)
        if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
            raise NotGGUF("the GGUF header names an invalid general.alignment")
        tensors: list[tuple[str, int, int]] = []
        for _ in range(header["gguf.tensor_count"]):
            name = _string(fh)
            dims = int(_unpack(fh, "<I"))
            if not 1 <= dims <= MAX_DIMS:
                raise NotGGUF(f"tensor {name!r} has {dims} dimensions")
            shape = [int(_unpack(fh, "<Q")) for _ in range(dims)]
            kind = int(_unpack(fh, "<I"))
            offset = int(_unpack(fh, "<Q"))
            if kind not in TENSOR_TYPES:
                raise NotGGUF(f"tensor {name!r} has an unknown type {kind}")
            block, block_bytes = TENSOR_TYPES[kind]
            elements = 1
            for extent in shape:
                elements *= extent
            if shape[0] % block:
                raise NotGGUF(f"tensor {name!r} does not fill whole blocks of its type")
            if offset % alignment:
                raise NotGGUF(f"tensor {name!r} is not aligned")
            tensors.append((name, offset, elements // block * block_bytes))
        here = fh.tell()
        data_start = (here + alignment - 1) // alignment * alignment
    except (OSError, struct.error, OverflowError) as exc:
        raise NotGGUF(f"the GGUF file cannot be read: {exc}") from exc
    for name, offset, nbytes in tensors:
        if data_start + offset + nbytes > size:
            raise NotGGUF(f"the file ends inside the data of tensor {name!r} (truncated?)")
    if data_start > size:
        raise NotGGUF("the file ends inside its tensor table")
    return header


def _file_type_name(code: int) -> str:
    import llama_cpp

    for name in dir(llama_cpp):
        if name.startswith("LLAMA_FTYPE_") and getattr(llama_cpp, name) == code:
            return name.removeprefix("LLAMA_FTYPE_").removeprefix("MOSTLY_")
    return f"type-{code}"


def model_metadata(path: Path) -> dict[str, Any]:
    """What ``models.metadata`` records about a GGUF file: architecture, context length,
    chat template presence and quantization (file type)."""
    return metadata_of(read_header(path))


def metadata_of(header: dict[str, Any]) -> dict[str, Any]:
    """The ``models.metadata`` fields of a header read by :func:`read_header`."""
    arch = header.get("general.architecture")
    if not isinstance(arch, str):
        raise NotGGUF("the GGUF header names no general.architecture")
    context = header.get(f"{arch}.context_length")
    file_type = header.get("general.file_type")
    meta: dict[str, Any] = {
        "architecture": arch,
        "context_length": int(context) if isinstance(context, int) else None,
        "chat_template": isinstance(header.get("tokenizer.chat_template"), str),
        "quantization": _file_type_name(file_type) if isinstance(file_type, int) else None,
        "gguf_version": header["gguf.version"],
        "tensor_count": header["gguf.tensor_count"],
    }
    if isinstance(header.get("general.name"), str):
        meta["name"] = header["general.name"]
    return meta
