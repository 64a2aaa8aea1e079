"""Runs last: every token this test session saw — minted in process, or written to an
``owner.token`` by a server subprocess — is absent, in clear, from every SQLite file,
server log and in-process log line the whole suite produced."""

from __future__ import annotations

import pytest

from lmsp.app.root import open_service
from lmsp.config import Settings
from lmsp.store.clients import TOKEN_PREFIX
from tests.conftest import LOG_LINES, MINTED_TOKENS


def test_no_token_in_clear_anywhere_the_suite_wrote(
    tmp_path_factory: pytest.TempPathFactory, settings: Settings
) -> None:
    own = open_service(settings)  # one more service, so the scan always has a subject
    own.db.close()
    base = tmp_path_factory.getbasetemp()
    tokens = set(MINTED_TOKENS) | {p.read_text().strip() for p in base.rglob("owner.token")}
    assert tokens and all(t.startswith(TOKEN_PREFIX) for t in tokens)
    secrets = [t.encode() for t in tokens] + [t[len(TOKEN_PREFIX) :].encode() for t in tokens]

    def leaks(data: bytes) -> list[bytes]:
        """What surrounds each token found (the token itself masked)."""
        found = []
        for secret in secrets:
            at = data.find(secret)
            if at >= 0:
                found.append(
                    data[max(0, at - 120) : at] + b"<TOKEN>" + data[at + len(secret) :][:40]
                )
        return found

    files = [p for p in base.rglob("*") if p.is_file() and (".db" in p.name or p.suffix == ".log")]
    assert any(p.name == "lmsp.db" for p in files)
    scanned = 0
    for path in files:
        try:
            data = path.read_bytes()
        except FileNotFoundError:  # SQLite removes -wal/-shm when its last connection closes
            continue
        scanned += 1
        assert not leaks(data), f"a token in clear in {path}: {leaks(data)}"
    logged = "\n".join(LOG_LINES).encode()
    assert not leaks(logged), f"a token in clear in a log line: {leaks(logged)}"
    assert scanned
    print(f"scanned {scanned} files and {len(LOG_LINES)} log lines for {len(tokens)} tokens")
