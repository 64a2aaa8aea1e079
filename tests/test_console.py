"""The console in a real headless Chromium (Debian's ``chromium`` driven by Playwright):
sign in by the one-time link (once only), approve a pairing request an agent made, watch
a task's text appear live and cancel it, and a cross-site form post refused.

Without Chromium these tests skip and say why, unless ``CI=1`` or
``LMSP_REQUIRE_BROWSER=1`` (``.ci/run`` sets it and installs ``chromium``): then they
fail. ``LMSP_SCREENSHOT=docs/console.png`` keeps the screenshot the follow test takes.
"""

from __future__ import annotations

import http.server
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from lmsp.cli import main
from tests.helpers import Server, seeded_data_dir

pytestmark = pytest.mark.slow

CHROMIUM = Path(os.environ.get("LMSP_CHROMIUM", "/usr/bin/chromium"))
REQUIRED = os.environ.get("CI") == "1" or os.environ.get("LMSP_REQUIRE_BROWSER") == "1"


def _browser_missing() -> str | None:
    if not CHROMIUM.exists():
        return f"no Chromium at {CHROMIUM} (apt-get install chromium)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed (pip install -e '.[dev]')"
    return None


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    missing = _browser_missing()
    if missing is not None:
        if REQUIRED:
            pytest.fail(f"browser tests are required here but cannot run: {missing}")
        pytest.skip(missing)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as play:
        chromium = play.chromium.launch(
            executable_path=str(CHROMIUM), args=["--no-sandbox", "--disable-gpu"]
        )
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, blob_cache: Path) -> Iterator[Server]:
    data_dir = seeded_data_dir(tmp_path_factory.mktemp("console") / "data", blob_cache)
    srv = Server(data_dir, env={"LMSP_TEST_ENGINE_DELAY": "0.4"}).start()
    yield srv
    srv.stop()


def login_link(server: Server) -> str:
    """What ``lmsp console`` prints."""
    env = {"LMSP_URL": server.url, "LMSP_DATA_DIR": str(server.data_dir), "LMSP_TOKEN": None}
    result = CliRunner().invoke(main, ["console", "--json"], env=env, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    url: str = json.loads(result.stdout)["url"]
    assert url.startswith(f"{server.url}/console/login?code=")
    return url


@pytest.fixture
def page(browser: Any, server: Server) -> Iterator[Any]:
    """A signed-in console page (a fresh browser context: its own cookies)."""
    context = browser.new_context(viewport={"width": 1200, "height": 900})
    tab = context.new_page()
    tab.goto(login_link(server))
    tab.locator("#app").wait_for(state="visible", timeout=30_000)
    yield tab
    context.close()


def test_the_login_link_signs_in_once(browser: Any, server: Server) -> None:
    link = login_link(server)
    first = browser.new_context()
    tab = first.new_page()
    tab.goto(link)
    tab.locator("#app").wait_for(state="visible", timeout=30_000)
    assert tab.url == f"{server.url}/"
    assert "owner" in tab.locator("#who").inner_text()
    (cookie,) = [c for c in first.cookies() if c["name"] == "lmsp_console"]
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    assert tab.evaluate("document.cookie") == ""  # not readable by the page's scripts
    tab.locator("#model-rows").get_by_text("lmsp-test").wait_for(timeout=30_000)

    second = browser.new_context()
    again = second.new_page()
    answer = again.goto(link)
    assert answer is not None and answer.status == 403
    assert "not valid" in again.locator("body").inner_text()
    again.goto(f"{server.url}/")
    again.locator("#signin").wait_for(state="visible", timeout=30_000)
    assert again.locator("#app").is_hidden()
    second.close()

    tab.locator("#logout").click()
    tab.locator("#signin").wait_for(state="visible", timeout=30_000)
    tab.reload()
    tab.locator("#signin").wait_for(state="visible", timeout=30_000)
    first.close()


def test_approve_a_pairing_request_with_chosen_scopes(page: Any, server: Server) -> None:
    asked = httpx.post(f"{server.url}/v1/pairing", json={"client_name": "browser-agent"})
    assert asked.status_code == 201
    request = asked.json()
    code = request["user_code"]
    assert request["verification_uri"] == f"{server.url}/console/pair"
    assert request["verification_uri_complete"] == f"{server.url}/console/pair?user_code={code}"
    pending = httpx.post(f"{server.url}/v1/pairing/{request['id']}/token")
    assert pending.json()["error"]["code"] == "authorization_pending"

    page.goto(request["verification_uri_complete"])  # RFC 8628: the code filled in
    item = page.locator(f'#pairing-list li[data-code="{code}"]')
    item.wait_for(timeout=30_000)
    assert "wanted" in (item.get_attribute("class") or "")
    assert code in page.locator("#pairing-hint").inner_text()
    assert "browser-agent" in item.inner_text()
    boxes = item.locator("input[name=scope]")
    assert sorted(boxes.evaluate_all("bs => bs.map(b => b.value)")) == [
        "models:read",
        "responses:read",
        "responses:write",
    ]
    item.locator("input[value='responses:write']").uncheck()
    item.locator("button.approve").click()
    item.wait_for(state="detached", timeout=30_000)

    granted = httpx.post(f"{server.url}/v1/pairing/{request['id']}/token")
    assert granted.status_code == 200, granted.text
    assert granted.json()["scopes"] == ["models:read", "responses:read"]
    page.locator("#client-rows").get_by_text("browser-agent").wait_for(timeout=30_000)


def test_follow_a_task_live_and_cancel_it(page: Any, server: Server, tmp_path: Path) -> None:
    with server.client() as http:
        made = http.post(
            "/v1/clients",
            json={"name": "runaway-agent", "scopes": ["responses:read", "responses:write"]},
        ).json()
    agent = {"Authorization": f"Bearer {made['token']}"}
    created = httpx.post(
        f"{server.url}/v1/responses",
        json={"model": "lmsp-test", "input": "a long job", "background": True},
        headers=agent,
    ).json()
    task_id = created["task"]["id"]

    row = page.locator(f'#task-rows tr[data-id="{task_id}"]')
    row.wait_for(timeout=30_000)
    assert "runaway-agent" in row.inner_text()  # the owner sees every client's tasks
    row.locator("button.follow").click()
    text = page.locator("#follow-text")
    words = "n => document.querySelector('#follow-text').textContent.split(/\\s+/).length > n"
    page.wait_for_function(words, arg=2, timeout=60_000)
    seen = text.inner_text().split()
    page.wait_for_function(words, arg=len(seen) + 1, timeout=60_000)
    grown = text.inner_text().split()
    assert grown[: len(seen)] == seen and len(grown) > len(seen)  # live, as generated
    shot = Path(os.environ.get("LMSP_SCREENSHOT") or tmp_path / "console.png")
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000

    page.locator("#follow-cancel").click()
    page.wait_for_function(
        "() => document.querySelector('#follow-status').textContent === 'cancelled'",
        timeout=60_000,
    )
    final = httpx.get(f"{server.url}/v1/responses/{created['id']}", headers=agent).json()
    assert final["status"] == "cancelled"
    shown = page.locator("#follow-text").inner_text()
    logged = "".join(c["text"] for item in final["output"] for c in item["content"]).split()
    assert shown.split() == logged  # the page shows exactly the logged text
    row.locator("td.status").get_by_text("cancelled").wait_for(timeout=30_000)


class _Forger(http.server.BaseHTTPRequestHandler):
    """Another site's page that posts a form to the console's API when opened."""

    target = ""

    def do_GET(self) -> None:
        body = (
            "<!doctype html><form id=f method=post action='" + self.target + "'>"
            "<input name=x value=1></form><script>document.getElementById('f').submit()"
            "</script>"
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        return None


def test_a_cross_site_form_post_is_refused(page: Any, server: Server) -> None:
    with server.client() as api:
        created = api.post(
            "/v1/responses",
            json={"model": "lmsp-test", "input": "keep going", "background": True},
        ).json()
    task_id = created["task"]["id"]
    _Forger.target = f"{server.url}/v1/tasks/{task_id}/cancel"
    forger = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Forger)
    threading.Thread(target=forger.serve_forever, daemon=True).start()
    try:
        # the signed-in browser opens the other site's page, which posts the form
        with page.expect_response(lambda r: r.url == _Forger.target) as posted:
            page.goto(f"http://127.0.0.1:{forger.server_address[1]}/")
        assert posted.value.status in (401, 403)
        assert posted.value.json()["error"]["code"] in ("csrf_failed", "invalid_token")
    finally:
        forger.shutdown()
        forger.server_close()
    with server.client() as api:
        task = api.get(f"/v1/tasks/{task_id}").json()
        assert task["status"] in ("queued", "loading", "running")  # not cancelled
        api.post(f"/v1/tasks/{task_id}/cancel")

    # the session cookie alone does not change anything: the CSRF token must come too
    cookie = next(c for c in page.context.cookies() if c["name"] == "lmsp_console")
    jar = {"lmsp_console": cookie["value"]}
    bare = httpx.post(f"{server.url}/v1/console/links", cookies=jar)
    assert bare.status_code == 403 and bare.json()["error"]["code"] == "csrf_failed"
    session = httpx.get(f"{server.url}/console/session", cookies=jar).json()
    signed = httpx.post(
        f"{server.url}/v1/console/links", cookies=jar, headers={"X-CSRF-Token": session["csrf"]}
    )
    assert signed.status_code == 201
