"""Client-supplied text reaches the operator's terminal escaped (issue 8, defect 7), and
pairing slots are limited per source, visible and clearable."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner, Result
from fastapi.testclient import TestClient

from lmsp.api.app import create_app
from lmsp.cli import main
from lmsp.config import Settings
from tests.helpers import Server, seeded_data_dir

HIDE = "\x1b[8m"
TITLE = "\x1b]0;pwned\x07"
CSI8 = "\x9b"  # the 8-bit CSI: a control sequence in some terminals
RLO = "\u202e"  # right-to-left override: reorders what follows


def test_clean_shows_every_control_and_format_character() -> None:
    from lmsp.cli.safe import clean, clean_json

    assert clean(f"a{HIDE}b") == "a\\x1b[8mb"
    assert clean(TITLE) == "\\x1b]0;pwned\\x07"
    assert clean("row\nFORGED") == "row\\x0aFORGED"
    assert clean("keep\nlines\tand tabs", multiline=True) == "keep\nlines\tand tabs"
    assert clean(f"{CSI8}{RLO}\u200b\x7f") == "\\x9b\\u202e\\u200b\\x7f"
    assert clean("olá ñandú 雪 🙂") == "olá ñandú 雪 🙂"
    text = clean_json({"name": f"x{CSI8}{RLO}\x1b"})
    assert "\x9b" not in text and RLO not in text and "\x1b" not in text
    assert json.loads(text) == {"name": f"x{CSI8}{RLO}\x1b"}
    tag = "\U000e0020"  # a tag character: a format character past U+FFFF
    text = clean_json({"name": f"a{tag}b"})
    assert tag not in text and json.loads(text) == {"name": f"a{tag}b"}
    assert clean(tag) == "\\U000e0020"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, blob_cache: Path) -> Iterator[Server]:
    data_dir = seeded_data_dir(tmp_path_factory.mktemp("untrusted") / "data", blob_cache)
    srv = Server(data_dir).start()
    yield srv
    srv.stop()


def lmsp(server: Server, *args: str) -> Result:
    env = {"LMSP_URL": server.url, "LMSP_DATA_DIR": str(server.data_dir), "LMSP_TOKEN": None}
    return CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)


def no_raw_controls(text: str) -> None:
    raw = [c for c in text if (ord(c) < 32 and c not in "\n") or 0x7F <= ord(c) < 0xA0]
    assert not raw and RLO not in text, repr(text)


@pytest.mark.slow
def test_pair_ls_escapes_names_and_flags_admin(server: Server) -> None:
    names = [f"helper{HIDE} admin hidden", f"title{TITLE}", "evil\nFORGED ROW", f"c1{CSI8}{RLO}"]
    codes = []
    for name in names:
        made = httpx.post(
            f"{server.url}/v1/pairing", json={"client_name": name, "scopes": ["admin"]}
        )
        assert made.status_code == 201, made.text
        codes.append(made.json()["user_code"])
    table = lmsp(server, "pair", "ls")
    assert table.exit_code == 0, table.output
    no_raw_controls(table.output)
    assert "\\x1b[8m" in table.output and "\\x1b]0;pwned\\x07" in table.output
    assert not any(line.lstrip("│ ").startswith("FORGED") for line in table.output.splitlines())
    assert table.output.count("ADMIN") >= 2 * len(names)  # the column and one warning each
    as_json = lmsp(server, "pair", "ls", "--json")
    no_raw_controls(as_json.output)
    assert {p["client_name"] for p in json.loads(as_json.output)} >= set(names)
    approved = lmsp(server, "pair", "approve", codes[0])
    no_raw_controls(approved.output + approved.stderr)
    assert "admin" in approved.stderr


def test_pairing_slots_are_per_source_and_the_operator_clears_them(settings: Settings) -> None:
    small = dataclasses.replace(settings, max_pending_pairings_per_source=2)
    app = create_app(small)
    owner_headers: dict[str, str] = {}
    with TestClient(app, client=("198.51.100.7", 4000)) as flood:
        token = (settings.data_dir / "owner.token").read_text().strip()
        owner_headers["Authorization"] = f"Bearer {token}"
        made = [flood.post("/v1/pairing", json={"client_name": f"f{i}"}) for i in range(3)]
        assert [m.status_code for m in made] == [201, 201, 429]
        assert made[2].json()["error"]["code"] == "too_many_pairing_requests"
        # another source still gets a slot (the same app, already started, another peer)
        other = TestClient(app, client=("198.51.100.8", 4000))
        assert other.post("/v1/pairing", json={"client_name": "ok"}).status_code == 201
        pending = flood.get("/v1/pairing", headers=owner_headers).json()["data"]
        assert {p["source"] for p in pending} == {"198.51.100.7", "198.51.100.8"}
        cleared = flood.delete(
            "/v1/pairing", params={"source": "198.51.100.7"}, headers=owner_headers
        )
        assert [p["status"] for p in cleared.json()["data"]] == ["denied", "denied"]
        poll = flood.post(f"/v1/pairing/{made[0].json()['id']}/token")
        assert poll.json()["error"]["code"] == "access_denied"
        left = flood.get("/v1/pairing", headers=owner_headers).json()["data"]
        assert [p["source"] for p in left] == ["198.51.100.8"]
        assert flood.post("/v1/pairing", json={"client_name": "again"}).status_code == 201
