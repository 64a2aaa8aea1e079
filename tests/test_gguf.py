from __future__ import annotations

import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lmsp.bootstrap import bundled_model_path
from lmsp.gguf import NotGGUF, model_metadata, read_header
from tests.gguf_files import truncated


def test_the_bundled_model_metadata() -> None:
    meta = model_metadata(bundled_model_path())
    assert meta["architecture"] == "llama"
    assert meta["context_length"] == 8192
    assert meta["chat_template"] is True
    assert meta["quantization"] == "Q4_1"
    assert meta["tensor_count"] == 272


def test_arrays_are_summarised_not_loaded() -> None:
    header = read_header(bundled_model_path())
    tokens = header["tokenizer.ggml.tokens"]
    assert tokens["length"] == 49152


def test_a_truncated_file_still_has_its_header(tmp_path: Path) -> None:
    assert model_metadata(truncated(tmp_path / "t.gguf"))["architecture"] == "llama"


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"not a model at all",
        b"GGUF" + struct.pack("<I", 99) + bytes(16),  # unknown version
        b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 1 << 40),  # huge key
        b"GGUF" + struct.pack("<IQQ", 3, 0, 2),  # keys promised, none there
        b"GGUF" + struct.pack("<IQQ", 3, 0, 0),  # no general.architecture
    ],
)
def test_what_is_not_gguf(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "x.gguf"
    path.write_bytes(content)
    with pytest.raises(NotGGUF):
        model_metadata(path)


def test_a_header_cut_inside_a_value(tmp_path: Path) -> None:
    path = tmp_path / "cut.gguf"
    path.write_bytes(bundled_model_path().read_bytes()[:200])
    with pytest.raises(NotGGUF):
        read_header(path)


def _string_array_file(key: str, items: list[bytes], after: int) -> bytes:
    """A GGUF header of one string array ``key`` and then a uint32 ``after.key``."""
    body = b"GGUF" + struct.pack("<IQQ", 3, 0, 2)
    body += struct.pack("<Q", len(key)) + key.encode() + struct.pack("<IIQ", 9, 8, len(items))
    for item in items:
        body += struct.pack("<Q", len(item)) + item
    name = b"after.key"
    return body + struct.pack("<Q", len(name)) + name + struct.pack("<II", 4, after)


@given(
    lengths=st.lists(
        st.one_of(st.integers(0, 40), st.integers(60_000, 140_000)), min_size=0, max_size=40
    ),
    after=st.integers(0, 2**32 - 1),
)
@settings(max_examples=40, deadline=None)
def test_a_string_array_is_skipped_to_the_byte_whatever_its_blocks(
    tmp_path_factory: pytest.TempPathFactory, lengths: list[int], after: int
) -> None:
    """The vocabulary is skipped from 64 KiB blocks: strings that end on, inside or far
    past a block's edge leave the reader exactly at the next key."""
    items = [bytes([65 + i % 26]) * n for i, n in enumerate(lengths)]
    path = tmp_path_factory.mktemp("arrays") / "a.gguf"
    path.write_bytes(_string_array_file("tokenizer.ggml.tokens", items, after))
    header = read_header(path)
    assert header["tokenizer.ggml.tokens"] == {"array_of": 8, "length": len(items)}
    assert header["after.key"] == after


def test_a_string_array_cut_short_is_not_gguf(tmp_path: Path) -> None:
    whole = _string_array_file("tokenizer.ggml.tokens", [b"x" * 70_000, b"yz"], 7)
    for cut in (30, 70_000, len(whole) - 20):
        path = tmp_path / f"cut{cut}.gguf"
        path.write_bytes(whole[:cut])
        with pytest.raises(NotGGUF):
            read_header(path)
