"""``lmsp models`` against a real ``lmsp serve`` subprocess."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from lmsp.bootstrap import file_digest
from lmsp.cli import main
from lmsp.store.blobs import blob_path
from tests.gguf_files import flip_byte, variant
from tests.helpers import Server


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
