"""A long prompt being read shows its progress, and what waits behind it says why
(issue 36, item 16: ``lmsp ps`` showed ``PROMPT 10153 │ OUTPUT 0 │ TOKENS/S -`` for
2.5 minutes while Codex's first prompt was read, and another client's request crawled
behind it with nothing saying why).

Through a real ``lmsp serve`` and the bundled model: one sequence and the reserved
one. The owner's task reads a prompt of some 6,500 tokens (seconds on this machine);
meanwhile another client's first request takes the reserved sequence and generates in
the same steps, and that client's second request waits in the queue. ``lmsp ps``
(``GET /v1/service/activity``) must show the prompt read so far growing, of its total,
at a rate; the generating request slowed by that prompt; the queued one waiting for a
sequence, and why. The console shows the same on the task's row.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from lmsp.bootstrap import DEFAULT_MODEL_ID
from lmsp.cli import main
from tests.helpers import Server, seeded_data_dir
from tests.test_console import browser, login_link

pytestmark = pytest.mark.slow
__all__ = ["browser"]  # the Chromium fixture (it skips, or fails under CI, without one)

COLOURS = ["red", "green", "blue", "amber", "violet", "grey"]
#: some 6,500 tokens of the bundled model's vocabulary: seconds to read on two cores
LONG_PROMPT = (
    " ".join(
        f"Item {i}: the {COLOURS[i % 6]} box on shelf {i % 17} holds {i * 7} stones."
        for i in range(310)
    )
    + "\nWhich box holds the most stones?"
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, blob_cache: Path) -> Iterator[Server]:
    data_dir = seeded_data_dir(tmp_path_factory.mktemp("progress") / "data", blob_cache)
    one = {"LMSP_PARALLEL": "1", "LMSP_RESERVED_SEQUENCES": "1", "LMSP_KV_CACHE_BYTES": "0"}
    srv = Server(data_dir, env=one).start()
    yield srv
    srv.stop()


def ps(server: Server, *args: str) -> str:
    env = {"LMSP_DATA_DIR": str(server.data_dir), "LMSP_URL": None, "LMSP_TOKEN": None}
    result = CliRunner().invoke(main, ["ps", *args], env=env, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.stdout


def background(http: httpx.Client, text: str, **fields: Any) -> dict[str, Any]:
    body = {"model": DEFAULT_MODEL_ID, "input": text, "background": True, **fields}
    made = http.post("/v1/responses", json=body)
    assert made.status_code == 202, made.text
    return made.json()


def another_client(server: Server) -> httpx.Client:
    with server.client() as owner:
        made = owner.post(
            "/v1/clients",
            json={"name": "second-agent", "scopes": ["responses:read", "responses:write"]},
        ).json()
    return httpx.Client(
        base_url=server.url, headers={"Authorization": f"Bearer {made['token']}"}, timeout=60
    )


def until(look: Any, seen: Any, what: str, timeout: float = 600) -> Any:
    """``look()`` again and again until ``seen(result)``: the result."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = look()
        if seen(found):
            return found
        time.sleep(0.05)
    raise AssertionError(f"never saw {what}")


def test_a_long_prompt_shows_its_progress_and_what_waits_says_why(server: Server) -> None:
    with server.client() as owner, another_client(server) as agent:
        long = background(owner, LONG_PROMPT, max_output_tokens=8)
        long_task = long["task"]["id"]

        def activity() -> dict[str, Any]:
            state: dict[str, Any] = json.loads(ps(server, "--json"))
            return state

        def reading(state: dict[str, Any]) -> dict[str, Any] | None:
            for seq in state["sequences"]:
                if seq["task_id"] == long_task and seq["phase"] == "reading":
                    return seq if seq["prompt_read"] > 0 else None
            return None

        first = reading(until(activity, reading, "the long prompt's first progress"))
        assert first is not None
        assert first["prompt_total"] == first["prompt_tokens"] > 6000, first
        assert 0 < first["prompt_read"] < first["prompt_total"], first
        assert first["prompt_tokens_per_second"] > 0 and first["output_tokens"] == 0, first

        # another client's first request takes the reserved sequence and generates in
        # the steps that read the long prompt; its second one waits for a sequence
        short = background(agent, "Count from one to fifty.", max_output_tokens=400)
        queued = background(agent, "Name a colour.", max_output_tokens=8)

        def told(state: dict[str, Any]) -> bool:
            seqs = {s["task_id"]: s for s in state["sequences"]}
            waits = {w["task_id"]: w for w in state["waiting"]}
            slowed = seqs.get(short["task"]["id"])
            return (
                reading(state) is not None
                and slowed is not None
                and slowed["phase"] == "generating"
                and queued["task"]["id"] in waits
            )

        state = until(activity, told, "the generating request slowed, the other queued")
        later = reading(state)
        assert later is not None and later["prompt_read"] > first["prompt_read"], later
        slowed = next(s for s in state["sequences"] if s["task_id"] == short["task"]["id"])
        assert slowed["reason"].startswith("slowed: the prompt of task " + long_task), slowed
        assert f"of {later['prompt_total']:,} read" in slowed["reason"], slowed
        (waiting,) = [w for w in state["waiting"] if w["task_id"] == queued["task"]["id"]]
        assert waiting["status"] == "queued", waiting
        why = waiting["reason"]
        assert why.startswith("queued: all 1 sequences busy"), why
        assert "reserved one is for a client with nothing running" in why, why
        assert f"the prompt of task {long_task} is being read" in why, why

        # the table says the same
        table = until(
            lambda: ps(server),
            lambda out: f"/{later['prompt_total']:,} read" in out and "slowed:" in out,
            "ps's table showing the prompt's progress",
        )
        assert "Waiting" in table and "all 1 sequences busy" in table, table
        for made, client in ((long, owner), (short, agent), (queued, agent)):
            client.post(f"/v1/responses/{made['id']}/cancel")


def test_the_console_shows_a_prompt_being_read(server: Server, browser: Any) -> None:
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    try:
        with server.client() as owner:
            long = background(owner, LONG_PROMPT + " Answer in one word.", max_output_tokens=8)
            tab = context.new_page()
            tab.goto(login_link(server))
            row = tab.locator(f'#task-rows tr[data-id="{long["task"]["id"]}"]')
            row.wait_for(timeout=60_000)
            now = row.locator("td.now")
            tab.wait_for_function(
                "cell => / of [0-9,]+ \\(\\d[\\d,]* tok\\/s\\)$/.test(cell.textContent)",
                arg=now.element_handle(),
                timeout=600_000,
            )
            shown = now.inner_text()
            assert shown.startswith("reading its prompt: "), shown
            owner.post(f"/v1/responses/{long['id']}/cancel")
    finally:
        context.close()
