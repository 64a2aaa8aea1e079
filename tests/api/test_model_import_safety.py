"""Importing a model names a path on the server's disk: the import opens it once, checks
and copies that open file, refuses anything but a whole GGUF, and answers the same for
every path it cannot use, telling nothing about the server's files."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from lmsp.bootstrap import bundled_model_path, file_digest
from lmsp.config import Settings
from lmsp.store import blobs
from tests.gguf_files import truncated


def post(client: TestClient, path: str, model_id: str = "imp") -> Any:
    return client.post("/v1/models", json={"id": model_id, "path": path})


def blob_names(settings: Settings) -> set[str]:
    return {p.name for p in settings.blobs_dir.iterdir()}


def test_a_truncated_gguf_is_refused(
    client: TestClient, settings: Settings, tmp_path: Path
) -> None:
    before = blob_names(settings)
    answer = post(client, str(truncated(tmp_path / "cut.gguf")))
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["code"] == "invalid_model_file"
    assert client.get("/v1/models/imp").status_code == 404
    assert blob_names(settings) == before  # no blob, no partial copy


def test_every_unusable_path_gets_one_answer(client: TestClient, tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    paths = {
        "missing": str(tmp_path / "missing.gguf"),
        "directory": str(tmp_path),
        "device": "/dev/zero",
        "fifo": str(fifo),  # an open without O_NONBLOCK would hang here
        "long name": str(tmp_path / ("x" * 300)),
        "nul byte": str(tmp_path / "a\0b"),
        "no such user": "~no-such-user-lmsp/model.gguf",  # expanduser raises
    }
    answers = {}
    for what, path in paths.items():
        answer = post(client, path)
        assert answer.status_code == 400, (what, answer.text)
        answers[what] = answer.json()
        assert str(tmp_path) not in answer.text and "/dev" not in answer.text, what
    assert len({repr(a) for a in answers.values()}) == 1, answers


def test_the_file_checked_is_the_file_copied(
    client: TestClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The path is swapped (a symlink pointed elsewhere) after it was checked and before
    the copy: what is imported is still the file that was checked."""
    good = tmp_path / "good.gguf"
    shutil.copyfile(bundled_model_path(), good)
    zeros = tmp_path / "zeros.bin"
    zeros.write_bytes(b"\0" * (6 << 20))
    link = tmp_path / "model.gguf"
    link.symlink_to(good)
    real_usage = shutil.disk_usage

    def swap_then_usage(path: Any) -> Any:
        link.unlink()
        link.symlink_to(zeros)
        return real_usage(path)

    monkeypatch.setattr(blobs.shutil, "disk_usage", swap_then_usage)
    answer = post(client, str(link))
    assert answer.status_code == 201, answer.text
    assert answer.json()["digest"] == file_digest(good)[0]


def test_at_most_the_checked_size_is_copied(
    client: TestClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file that grows while it is copied (or a device behind it) cannot fill the
    disk: the copy stops at the size read when the file was checked."""
    source = tmp_path / "growing.gguf"
    shutil.copyfile(bundled_model_path(), source)
    digest, size = file_digest(source)
    real_write = blobs.write_chunk
    grown = []

    def write_and_grow(out: Any, chunk: bytes) -> None:
        if not grown:
            with source.open("ab") as more:
                more.write(b"\0" * (8 << 20))
            grown.append(True)
        real_write(out, chunk)

    monkeypatch.setattr(blobs, "write_chunk", write_and_grow)
    answer = post(client, str(source))
    assert answer.status_code == 201, answer.text
    assert answer.json()["size_bytes"] == size and answer.json()["digest"] == digest
