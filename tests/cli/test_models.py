"""``lmsp models`` against a real ``lmsp serve`` subprocess."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from lmsp.bootstrap import DEFAULT_MODEL_ID, file_digest
from lmsp.cli import main
from lmsp.store.blobs import blob_path
from tests.gguf_files import flip_byte, variant
from tests.helpers import Server, seeded_data_dir


@pytest.mark.slow
def test_ls_add_verify_rm(tmp_path: Path) -> None:
    server = Server(tmp_path / "data").start()
    try:
        where = ["--url", server.url, "--token", server.token]
        cli = CliRunner()

        def run(*args: str) -> tuple[int, str]:
            result = cli.invoke(main, ["models", *args, *where])
            return result.exit_code, result.output

        code, out = run("ls")
        assert code == 0 and "smollm2-135m-instruct" in out and "lmsp-test" in out

        source = variant(tmp_path / "v.gguf", b"C")
        digest, size = file_digest(source)
        code, out = run("add", str(source), "--id", "smol-cli")
        assert code == 0 and f"added smol-cli: {digest}" in out
        code, out = run("ls", "--json")
        listed = {m["id"]: m for m in json.loads(out)}
        assert listed["smol-cli"]["digest"] == digest
        assert listed["smol-cli"]["size_bytes"] == size

        code, out = run("verify", "smol-cli")
        assert (code, out.strip()) == (0, "smol-cli: ok")
        flip_byte(blob_path(server.data_dir / "blobs", digest))
        code, out = run("verify")
        assert code == 1 and "smol-cli: CORRUPT" in out and "lmsp-test: ok" in out

        code, out = run("rm", "smol-cli")
        assert (code, out.strip()) == (0, "deleted smol-cli")
        assert not blob_path(server.data_dir / "blobs", digest).exists()
        code, out = run("rm", "smol-cli")
        assert code == 1 and "not_found" in out
    finally:
        server.stop()


@pytest.mark.slow
def test_set_defaults(tmp_path: Path) -> None:
    server = Server(tmp_path / "data").start()
    try:
        where = ["--url", server.url, "--token", server.token]
        cli = CliRunner()

        def run(*args: str) -> tuple[int, str]:
            result = cli.invoke(main, ["models", *args, *where])
            return result.exit_code, result.output

        code, out = run("set", "lmsp-test", "--temperature", "0.4", "--repeat-penalty", "1.15")
        assert (code, out.strip()) == (
            0,
            "lmsp-test: defaults repeat_penalty=1.15, temperature=0.4",
        )
        code, out = run("set", "lmsp-test", "--top-k", "20", "--unset", "temperature", "--json")
        assert code == 0 and json.loads(out)["defaults"] == {"repeat_penalty": 1.15, "top_k": 20}
        with server.client() as http:
            obj = http.post("/v1/responses", json={"model": "lmsp-test", "input": "x"}).json()
        assert (obj["temperature"], obj["repeat_penalty"], obj["top_k"]) == (1.0, 1.15, 20)
        code, out = run("set", "lmsp-test", "--temperature", "5")
        assert code == 1 and "defaults.temperature" in out
        code, out = run("set", "lmsp-test")
        assert code == 2 and "at least one" in out
        code, out = run("set", "nope", "--temperature", "0.5")
        assert code == 1 and "not_found" in out
    finally:
        server.stop()


@pytest.mark.slow
def test_ollama_habits_and_the_context_served(tmp_path: Path, blob_cache: Path) -> None:
    """What a user of ollama types (issue 36, item 17): ``lmsp run MODEL PROMPT``,
    ``lmsp list``, ``lmsp models`` alone; and the context ``models ls`` shows is the one
    the service runs the model at (``LMSP_N_CTX`` past the trained 8,192: YaRN), the
    trained one labelled, before the model is loaded and after."""
    served = {"LMSP_N_CTX": "16384", "LMSP_PARALLEL": "1", "LMSP_RESERVED_SEQUENCES": "0"}
    server = Server(seeded_data_dir(tmp_path / "data", blob_cache), env=served).start()
    try:
        env = {"LMSP_URL": server.url, "LMSP_DATA_DIR": str(server.data_dir), "LMSP_TOKEN": None}
        cli = CliRunner()

        def lmsp(*args: str) -> tuple[int, str, str]:
            result = cli.invoke(main, list(args), env=env)
            return result.exit_code, result.stdout, result.stderr

        def contexts(loaded: bool) -> dict[str, tuple[int, int]]:
            code, out, err = lmsp("models", "--json")
            assert code == 0, err
            models = json.loads(out)
            assert {m["id"]: m["loaded"] for m in models}[DEFAULT_MODEL_ID] is loaded
            return {
                m["id"]: (m["context_length"], m["metadata"].get("context_length")) for m in models
            }

        assert contexts(loaded=False)[DEFAULT_MODEL_ID] == (16384, 8192)
        code, listing, err = lmsp("models")
        assert code == 0, err
        row = next(line for line in listing.splitlines() if DEFAULT_MODEL_ID in line)
        assert "16,384 (trained 8,192)" in row, listing
        assert lmsp("list") == (0, listing, "")
        assert lmsp("models", "ls") == (0, listing, "")
        code, _, err = lmsp("models", "--json", "ls")  # refused, not ignored
        assert code == 2 and "lmsp models ls --json" in err, err

        code, out, err = lmsp("run", "lmsp-test", "two", "words", "--json")
        assert code == 0, err
        answer = json.loads(out)
        assert answer["model"] == "lmsp-test" and answer["status"] == "completed"
        with server.client() as http:
            items = http.get(f"/v1/responses/{answer['id']}/input_items").json()["data"]
        assert items[0]["content"][0]["text"] == "two words"
        code, out, err = lmsp("run", DEFAULT_MODEL_ID, "Say hi.", "--max-output-tokens", "8")
        assert code == 0 and out.strip(), err
        code, listing, err = lmsp("models", "ls")
        assert code == 0 and "16,384 (trained 8,192)" in listing, listing
        shown = contexts(loaded=True)  # the loaded engine's own (one model loaded at once)
        assert shown[DEFAULT_MODEL_ID] == (16384, 8192) and shown["lmsp-test"][0] == 4096
    finally:
        server.stop()
