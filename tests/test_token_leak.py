"""No token in clear: not in the SQLite files (database, WAL, shared memory), not in any
log line of a server run, not in any error body."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from lmsp.store.clients import hash_token, new_token
from tests.helpers import Server, seeded_data_dir

pytestmark = pytest.mark.slow


def sqlite_bytes(data_dir: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(data_dir.glob("lmsp.db*")) if p.is_file())


def test_no_token_in_the_database_or_the_logs(tmp_path: Path, blob_cache: Path) -> None:
    server = Server(seeded_data_dir(tmp_path / "data", blob_cache)).start()
    tokens: list[str] = [server.token]
    errors: list[str] = []
    try:
        with server.client() as owner:
            made = owner.post("/v1/clients", json={"name": "a", "scopes": ["responses:write"]})
            tokens.append(made.json()["token"])
            pending = httpx.post(f"{server.url}/v1/pairing", json={"client_name": "b"}).json()
            owner.post(f"/v1/pairing/{pending['user_code']}/approve")
            claimed = httpx.post(f"{server.url}/v1/pairing/{pending['id']}/token").json()
            tokens.append(claimed["token"])
            for token in tokens[1:]:
                auth = {"Authorization": f"Bearer {token}"}
                httpx.post(
                    f"{server.url}/v1/responses",
                    json={"model": "lmsp-test", "input": "x"},
                    headers=auth,
                )
                errors.append(httpx.get(f"{server.url}/v1/clients", headers=auth).text)
            never_valid = new_token()
            tokens.append(never_valid)
            errors.append(
                httpx.get(
                    f"{server.url}/v1/tasks", headers={"Authorization": f"Bearer {never_valid}"}
                ).text
            )
            owner.delete(f"/v1/clients/{made.json()['id']}")
            errors.append(
                httpx.get(
                    f"{server.url}/v1/tasks", headers={"Authorization": f"Bearer {tokens[1]}"}
                ).text
            )
        added = subprocess.run(
            [sys.executable, "-m", "lmsp", "clients", "add", "c", "--scopes", "models:read"],
            env=dict(os.environ, LMSP_URL=server.url, LMSP_DATA_DIR=str(server.data_dir)),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert added.returncode == 0, added.stderr
        tokens.append(added.stdout.strip())
        running = sqlite_bytes(server.data_dir)
    finally:
        server.stop()
    stopped = sqlite_bytes(server.data_dir)
    log_lines = server.log_path.read_text().splitlines()
    assert len(log_lines) > 5 and any("POST /v1/pairing" in line for line in log_lines)
    assert len(set(tokens)) == 5
    for token in tokens:
        secret = token[len("lmsp_") + 6 :]  # what the displayed prefix does not show
        for blob in (running, stopped):
            assert token.encode() not in blob and secret.encode() not in blob
        assert not [line for line in log_lines if token in line or secret in line]
        assert not [body for body in errors if secret in body]
    for token in tokens[:3] + tokens[4:]:  # the scan does see the stored hashes
        assert hash_token(token).encode() in running + stopped
