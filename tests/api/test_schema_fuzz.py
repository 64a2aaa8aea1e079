"""Property-based requests generated from the OpenAPI document (schemathesis) against a
real server: no input makes it answer 5xx, and every error has the section 8 shape."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from tests.helpers import Server

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = Server(tmp_path_factory.mktemp("fuzz") / "data", env={"LMSP_TEST_ENGINE_DELAY": "0"})
    srv.start()
    yield srv
    srv.stop()


def test_no_input_breaks_the_server(fuzz_server: Server) -> None:
    schema = schemathesis.openapi.from_url(f"{fuzz_server.url}/openapi.json")
    auth = {"Authorization": f"Bearer {fuzz_server.token}"}
    checked = []
    calls = []
    for result in schema.get_all_operations():
        operation = result.ok()

        @given(case=operation.as_strategy())
        @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
        def run(case) -> None:  # type: ignore[no-untyped-def]
            response = case.call(base_url=fuzz_server.url, headers=auth, timeout=30)
            calls.append(response.status_code)
            assert response.status_code < 500, (case.method, case.path, response.text)
            if response.status_code >= 400:
                error = response.json()["error"]
                if case.path.startswith("/v1/messages"):  # Anthropic's envelope there
                    assert response.json()["type"] == "error"
                    assert set(error) == {"type", "message"}
                else:
                    assert set(error) == {"type", "code", "message", "param"}
                assert "Traceback" not in response.text

        run()
        checked.append(operation.label)
    assert "POST /v1/responses" in checked and len(checked) >= 10
    assert len(calls) > 100
    assert any(code < 300 for code in calls) and any(code >= 400 for code in calls)


def test_fuzz_data_dir_is_consistent(fuzz_server: Server, tmp_path: Path) -> None:
    from tests.helpers import check_log_invariants, open_db

    check_log_invariants(open_db(fuzz_server.data_dir))
