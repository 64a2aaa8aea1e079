from __future__ import annotations

import struct
from pathlib import Path

import pytest

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
