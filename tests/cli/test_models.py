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
