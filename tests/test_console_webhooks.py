"""The console lists webhooks (issue 25): in a real headless Chromium, signed in as the
owner, a webhook another client registered appears with its URL, events and client,
and goes when it is removed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers import Server, seeded_data_dir
from tests.test_console import browser, login_link

pytestmark = pytest.mark.slow

__all__ = ["browser"]  # the Chromium fixture (it skips, or fails under CI, without one)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, blob_cache: Path) -> Iterator[Server]:
    data_dir = seeded_data_dir(tmp_path_factory.mktemp("console-hooks") / "data", blob_cache)
    srv = Server(data_dir).start()
    yield srv
    srv.stop()


def test_the_console_lists_webhooks(browser: Any, server: Server) -> None:
    with server.client() as owner:
        made = owner.post(
            "/v1/clients", json={"name": "hook-agent", "scopes": ["responses:write"]}
        ).json()
        agent = httpx.Client(
            base_url=server.url, headers={"Authorization": f"Bearer {made['token']}"}
        )
        hook = agent.post(
            "/v1/webhooks",
            json={"url": "http://127.0.0.1:9/agent-hook", "events": ["response.failed"]},
        ).json()
    context = browser.new_context(viewport={"width": 1200, "height": 900})
    try:
        tab = context.new_page()
        tab.goto(login_link(server))
        tab.locator("#app").wait_for(state="visible", timeout=30_000)
        row = tab.locator("#webhook-rows tr", has_text=hook["id"])
        row.wait_for(timeout=30_000)
        cells = row.locator("td").all_inner_texts()
        assert cells[1] == "http://127.0.0.1:9/agent-hook"
        assert cells[2] == "failed" and cells[3] == "hook-agent"
        assert tab.locator("#webhooks-empty").is_hidden()
        assert agent.delete(f"/v1/webhooks/{hook['id']}").status_code == 200
        row.wait_for(state="detached", timeout=30_000)
        tab.locator("#webhooks-empty").wait_for(state="visible", timeout=30_000)
    finally:
        context.close()
        agent.close()
