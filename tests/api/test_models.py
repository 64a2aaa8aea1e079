"""``/v1/models`` through the real app: import, integrity, deletion, loading."""

from __future__ import annotations

import dataclasses
import errno
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import pytest
from fastapi.testclient import TestClient

from lmsp.api.app import create_app
from lmsp.bootstrap import DEFAULT_MODEL_ID, bundled_model_path, file_digest
from lmsp.config import Settings
from lmsp.engines import kvfiles
from lmsp.engines.llama_cpp import LlamaTokenizer
from lmsp.store import blobs
from tests.api.test_responses import wait_status
from tests.gguf_files import flip_byte, unknown_architecture, variant

SMALL = {"input": "Say hi.", "max_output_tokens": 4, "temperature": 0}


def blob(settings: Settings, digest: str) -> Path:
    return blobs.blob_path(settings.blobs_dir, digest)


def ask(client: TestClient, model: str, **body: Any) -> dict[str, Any]:
    reply = client.post("/v1/responses", json={"model": model, **SMALL, **body})
    assert reply.status_code == 200, reply.text
    return reply.json()  # type: ignore[no-any-return]


def add(client: TestClient, model_id: str, path: Path, status: int = 201) -> dict[str, Any]:
    reply = client.post("/v1/models", json={"id": model_id, "path": str(path)})
    assert reply.status_code == status, reply.text
    return reply.json()  # type: ignore[no-any-return]


def test_import_the_bundled_model_under_a_new_id(client: TestClient, settings: Settings) -> None:
    source = bundled_model_path()
    digest, size = file_digest(source)
    model = add(client, "smol-copy", source)
    assert model["digest"] == digest and model["size_bytes"] == size
    assert model["format"] == "gguf" and model["loaded"] is False
    assert model["status"] == "ready" and model["verified_at"] is not None
    meta = model["metadata"]
    assert meta["architecture"] == "llama" and meta["context_length"] == 8192
    assert meta["chat_template"] is True and meta["quantization"] == "Q4_1"
    assert client.get("/v1/models/smol-copy").json() == model
    assert "smol-copy" in [m["id"] for m in client.get("/v1/models").json()["data"]]
    assert blob(settings, digest).stat().st_size == size
    assert blobs.leftovers(settings.blobs_dir) == []
    # the same file as the default model: one blob, kept while another record names it
    assert client.delete("/v1/models/smol-copy").json()["deleted"] is True
    assert client.get("/v1/models/smol-copy").status_code == 404
    assert blob(settings, digest).exists()
    assert ask(client, DEFAULT_MODEL_ID)["status"] == "incomplete"


def test_saved_prefixes_go_with_the_last_record_of_their_model(
    client: TestClient, settings: Settings
) -> None:
    digest, _ = file_digest(bundled_model_path())
    add(client, "smol-copy", bundled_model_path())
    kv = client.app.state.lmsp.kv  # type: ignore[attr-defined]
    kv.save(digest, [1, 2, 3], b"state")
    assert client.delete("/v1/models/smol-copy").json()["deleted"] is True
    assert kv.best(digest, [1, 2, 3]) == (3, b"state")  # the default model still uses it
    assert client.delete(f"/v1/models/{DEFAULT_MODEL_ID}").json()["deleted"] is True
    assert kv.best(digest, [1, 2, 3]) is None
    assert not (settings.kv_dir / kvfiles.dir_name(digest)).exists()


def test_import_errors(client: TestClient, tmp_path: Path) -> None:
    not_gguf = tmp_path / "notes.gguf"
    not_gguf.write_text("these are not weights")
    cases: list[tuple[dict[str, Any], int, str]] = [
        ({"id": "x", "path": str(not_gguf)}, 400, "invalid_model_file"),
        ({"id": "x", "path": str(tmp_path / "missing.gguf")}, 400, "model_file_not_found"),
        ({"id": "x", "path": str(tmp_path)}, 400, "model_file_not_found"),
        ({"id": DEFAULT_MODEL_ID, "path": str(bundled_model_path())}, 409, "model_exists"),
        ({"id": "x"}, 400, "invalid_value"),
        ({"id": "bad id!", "path": str(bundled_model_path())}, 400, "invalid_value"),
        (
            {"id": "x", "path": str(bundled_model_path()), "digest": "sha256:" + "0" * 64},
            400,
            "digest_mismatch",
        ),
    ]
    for body, status, code in cases:
        reply = client.post("/v1/models", json=body)
        assert (reply.status_code, reply.json()["error"]["code"]) == (status, code), body
    assert client.get("/v1/models/x").status_code == 404


def test_a_full_disk_answers_507_and_leaves_no_partial_blob(
    client: TestClient, settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = variant(tmp_path / "v.gguf")
    digest, _ = file_digest(source)
    written = 0

    def fill_up(out: BinaryIO, chunk: bytes) -> None:
        nonlocal written
        if written + len(chunk) > 8 << 20:  # the disk fills after 8 MiB
            raise OSError(errno.ENOSPC, "No space left on device")
        out.write(chunk)
        written += len(chunk)

    monkeypatch.setattr(blobs, "write_chunk", fill_up)
    before = sorted(p.name for p in settings.blobs_dir.iterdir())
    reply = client.post("/v1/models", json={"id": "full", "path": str(source)})
    assert reply.status_code == 507 and reply.json()["error"]["code"] == "insufficient_storage"
    assert written > 0  # the copy had begun
    assert sorted(p.name for p in settings.blobs_dir.iterdir()) == before
    assert not blob(settings, digest).exists() and blobs.leftovers(settings.blobs_dir) == []
    assert client.get("/v1/models/full").status_code == 404
    monkeypatch.undo()

    # known in advance: not enough free space for the file at all
    usage = blobs.shutil.disk_usage(settings.blobs_dir)
    monkeypatch.setattr(blobs.shutil, "disk_usage", lambda p: usage._replace(free=1024))
    assert client.post("/v1/models", json={"id": "full", "path": str(source)}).status_code == 507
    assert sorted(p.name for p in settings.blobs_dir.iterdir()) == before


def test_a_corrupt_copy_fails_its_task_with_model_corrupt(
    client: TestClient, settings: Settings, tmp_path: Path
) -> None:
    source = variant(tmp_path / "v.gguf")
    model = add(client, "smol-x", source)
    path = blob(settings, model["digest"])
    flip_byte(path)  # same size: only the full digest of the first load can tell
    failed = ask(client, "smol-x")
    assert failed["status"] == "failed" and failed["error"]["code"] == "model_corrupt"
    assert client.get("/v1/models/smol-x").json()["status"] == "corrupt"
    again = ask(client, "smol-x")  # known corrupt: refused without loading
    assert again["error"]["code"] == "model_corrupt"
    checked = client.post("/v1/models/smol-x/verify").json()
    assert checked["status"] == "corrupt" and "hashes to" in checked["problem"]

    path.write_bytes(source.read_bytes())  # restore the blob; verify clears the mark
    checked = client.post("/v1/models/smol-x/verify").json()
    assert checked["status"] == "ready" and checked["problem"] is None
    done = ask(client, "smol-x")
    assert done["status"] == "incomplete" and done["model_digest"] == model["digest"]

    flip_byte(path)  # damaged after a verified load: `verify` finds it
    assert client.post("/v1/models/smol-x/verify").json()["status"] == "corrupt"
    assert ask(client, "smol-x")["error"]["code"] == "model_corrupt"


def test_the_size_is_checked_before_every_load(client: TestClient, settings: Settings) -> None:
    model = client.get("/v1/models/lmsp-test").json()
    assert ask(client, "lmsp-test")["status"] == "incomplete"
    with blob(settings, model["digest"]).open("ab") as fh:
        fh.write(b"!")
    # still loaded, and already verified in full: the size check catches it anyway
    failed = ask(client, "lmsp-test")
    assert failed["status"] == "failed" and failed["error"]["code"] == "model_corrupt"


def test_delete_while_in_use_is_409(client: TestClient, settings: Settings, tmp_path: Path) -> None:
    model = add(client, "smol-del", variant(tmp_path / "v.gguf", b"D"))
    client.app.state.lmsp.runner.pause()  # the task stays queued
    created = client.post(
        "/v1/responses", json={"model": "smol-del", "input": "hi", "background": True}
    )
    assert created.status_code == 202
    reply = client.delete("/v1/models/smol-del")
    assert reply.status_code == 409 and reply.json()["error"]["code"] == "model_in_use"
    assert client.get("/v1/models/smol-del").status_code == 200
    assert blob(settings, model["digest"]).exists()

    client.post(f"/v1/responses/{created.json()['id']}/cancel")
    wait_status(client, created.json()["id"], "cancelled")
    kv = client.app.state.lmsp.kv  # type: ignore[attr-defined]
    kv.save(model["digest"], [1, 2, 3], b"state")
    assert client.delete("/v1/models/smol-del").json() == {
        "id": "smol-del",
        "object": "model",
        "deleted": True,
    }
    assert client.get("/v1/models/smol-del").status_code == 404
    assert not blob(settings, model["digest"]).exists()  # unreferenced: removed
    assert kv.best(model["digest"], [1, 2, 3]) is None  # its saved prefixes too
    assert not (settings.kv_dir / kvfiles.dir_name(model["digest"])).exists()
    gone = client.post("/v1/responses", json={"model": "smol-del", "input": "hi"})
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "model_not_found"


def test_a_model_that_cannot_load_fails_with_model_load_failed(
    client: TestClient, tmp_path: Path
) -> None:
    add(client, "smol-odd", unknown_architecture(tmp_path / "odd.gguf"))
    failed = ask(client, "smol-odd")
    assert failed["status"] == "failed" and failed["error"]["code"] == "model_load_failed"
    assert client.get("/v1/models/smol-odd").json()["loaded"] is False


@pytest.fixture
def quick_unload(settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(dataclasses.replace(settings, keep_alive=0.0))) as test_client:
        token = (settings.data_dir / "owner.token").read_text().strip()
        test_client.headers["Authorization"] = f"Bearer {token}"
        yield test_client


def wait_loaded(client: TestClient, model_id: str, loaded: bool) -> None:
    deadline = time.monotonic() + 30
    while client.get(f"/v1/models/{model_id}").json()["loaded"] is not loaded:
        assert time.monotonic() < deadline, f"{model_id} loaded stays {not loaded}"
        time.sleep(0.05)


def test_keep_alive_unloads_an_idle_model(quick_unload: TestClient) -> None:
    assert ask(quick_unload, "lmsp-test")["status"] == "incomplete"
    wait_loaded(quick_unload, "lmsp-test", False)


def test_another_model_takes_the_memory(client: TestClient) -> None:
    assert ask(client, "lmsp-test")["status"] == "incomplete"
    assert client.get("/v1/models/lmsp-test").json()["loaded"] is True
    assert ask(client, DEFAULT_MODEL_ID)["status"] == "incomplete"
    loaded = {m["id"]: m["loaded"] for m in client.get("/v1/models").json()["data"]}
    assert loaded == {DEFAULT_MODEL_ID: True, "lmsp-test": False}


def test_a_prompt_longer_than_the_context_is_refused_at_create(client: TestClient) -> None:
    for model, text in [("lmsp-test", "a" * 5000), (DEFAULT_MODEL_ID, "lighthouse " * 9000)]:
        reply = client.post("/v1/responses", json={"model": model, "input": text})
        error = reply.json()["error"]
        assert reply.status_code == 400, model
        assert (error["code"], error["param"]) == ("context_length_exceeded", "input")
    # a length known only when the task runs: response.failed with the same code
    failed = ask(client, "lmsp-test", input="[context-overflow]")
    assert failed["status"] == "failed" and failed["error"]["code"] == "context_length_exceeded"


def test_usage_counts_are_the_model_tokens(client: TestClient) -> None:
    done = ask(client, DEFAULT_MODEL_ID, instructions="Answer in French.", max_output_tokens=8)
    assert done["status"] == "incomplete"
    assert done["incomplete_details"] == {"reason": "max_output_tokens"}
    tokenizer = LlamaTokenizer(bundled_model_path(), 2048)
    try:
        prompt = tokenizer.prompt_tokens(
            [
                {"role": "system", "content": "Answer in French."},
                {"role": "user", "content": "Say hi."},
            ]
        )
    finally:
        tokenizer.close()
    assert done["usage"] == {
        "input_tokens": len(prompt),
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": 8,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": len(prompt) + 8,
    }
    assert done["model_digest"] == file_digest(bundled_model_path())[0]
