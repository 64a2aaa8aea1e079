"""A small pure reader of GGUF headers: is a file GGUF, and what does it say it is.

Only the key/value metadata at the head of the file is read (arrays such as the
vocabulary are skipped, not loaded), so checking a multi-gigabyte model costs a few
milliseconds and never hands a malformed file to llama.cpp.
"""

from __future__ import annotations

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


class NotGGUF(ValueError):
    """The file is not a GGUF model (or its header is damaged)."""


def _read(fh: BinaryIO, size: int) -> bytes:
    data = fh.read(size)
    if len(data) != size:
        raise NotGGUF("the GGUF header ends early")
    return data


def _unpack(fh: BinaryIO, fmt: str) -> Any:
    return struct.unpack(fmt, _read(fh, struct.calcsize(fmt)))[0]


def _string(fh: BinaryIO) -> str:
    length = int(_unpack(fh, "<Q"))
    if length > MAX_STRING:
        raise NotGGUF("a GGUF header string is implausibly long")
    return _read(fh, length).decode("utf-8", errors="replace")


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
            for _ in range(count):
                length = int(_unpack(fh, "<Q"))
                if length > MAX_STRING:
                    raise NotGGUF("a GGUF header string is implausibly long")
                fh.seek(length, 1)
        else:
            raise NotGGUF(f"unsupported GGUF array item type {item_kind}")
        return {"array_of": item_kind, "length": count}
    raise NotGGUF(f"unknown GGUF value type {kind}")


def read_header(path: Path) -> dict[str, Any]:
    """The key/value metadata of a GGUF file (arrays summarised); :class:`NotGGUF` if
    the file is not one."""
    try:
        with path.open("rb") as fh:
            if fh.read(4) != MAGIC:
                raise NotGGUF("the file does not start with the GGUF magic")
            version = int(_unpack(fh, "<I"))
            if version not in (2, 3):
                raise NotGGUF(f"unsupported GGUF version {version}")
            tensors = int(_unpack(fh, "<Q"))
            count = int(_unpack(fh, "<Q"))
            if count > MAX_KEYS:
                raise NotGGUF("the GGUF header has implausibly many keys")
            values: dict[str, Any] = {"gguf.version": version, "gguf.tensor_count": tensors}
            for _ in range(count):
                key = _string(fh)
                values[key] = _value(fh, int(_unpack(fh, "<I")))
            return values
    except (OSError, struct.error) as exc:
        if isinstance(exc, IsADirectoryError | PermissionError | FileNotFoundError):
            raise
        raise NotGGUF(f"the GGUF header cannot be read: {exc}") from exc


def _file_type_name(code: int) -> str:
    import llama_cpp

    for name in dir(llama_cpp):
        if name.startswith("LLAMA_FTYPE_") and getattr(llama_cpp, name) == code:
            return name.removeprefix("LLAMA_FTYPE_").removeprefix("MOSTLY_")
    return f"type-{code}"


def model_metadata(path: Path) -> dict[str, Any]:
    """What ``models.metadata`` records about a GGUF file: architecture, context length,
    chat template presence and quantization (file type)."""
    header = read_header(path)
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
