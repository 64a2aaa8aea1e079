"""Issue 39, items 5 and 6 and the orphan-output rule, through a real server.

- ``phase`` on assistant messages (Open Responses 2026-04-24) is accepted, stored and
  listed back; on another role, or with another value, it is refused.
- A PDF other readers open (no xref table, no ``startxref``, a wrong ``/Length``: the
  Open Responses suite's ``file-input`` fixture) is read; a bomb with its xref cut off
  is still refused.
- A ``function_call_output`` whose ``call_id`` answers no call of the input or of the
  history it continues is a ``400`` (before: 200, and the model was shown an answer to
  nothing); one that answers a call of the previous response is taken.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests import hostile
from tests.helpers import Server

MODEL = "lmsp-test"


@pytest.fixture(scope="module")
def http(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    server = Server(tmp_path_factory.mktemp("w39-inputs") / "data", env={"LMSP_PARALLEL": "1"})
    server.start()
    try:
        with server.client(timeout=120) as client:
            yield client
    finally:
        server.stop()


def create(http: httpx.Client, **body: Any) -> httpx.Response:
    return http.post("/v1/responses", json={"model": MODEL, "max_output_tokens": 8, **body})


def refused(answer: httpx.Response, code: str, param: str) -> str:
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert (error["code"], error["param"]) == (code, param), error
    return str(error["message"])


# -- phase ----------------------------------------------------------------------------------
def test_phase_on_assistant_messages_is_kept_and_listed(http: httpx.Client) -> None:
    given = [
        {"role": "assistant", "phase": "commentary", "content": "I should answer with it."},
        {"type": "message", "role": "assistant", "phase": "final_answer", "content": "Four."},
        {"role": "user", "content": "Repeat only the number."},
    ]
    answer = create(http, input=given)
    assert answer.status_code == 200, answer.text
    assert answer.json()["status"] in ("completed", "incomplete")
    page = http.get(
        f"/v1/responses/{answer.json()['id']}/input_items", params={"order": "asc"}
    ).json()
    assert [item.get("phase") for item in page["data"]] == ["commentary", "final_answer", None]


def test_phase_on_a_user_message_or_unknown_is_refused(http: httpx.Client) -> None:
    user = [{"role": "user", "phase": "commentary", "content": "Hi."}]
    refused(create(http, input=user), "unsupported_parameter", "input.0.phase")
    odd = [{"role": "assistant", "phase": "thinking", "content": "Hm."}, user[0] | {"phase": None}]
    assert "commentary" in refused(create(http, input=odd), "invalid_value", "input.0.phase")


# -- damaged PDFs -----------------------------------------------------------------------------
def test_a_pdf_without_xref_and_a_wrong_length_is_read(http: httpx.Client) -> None:
    pdf = hostile.damaged_pdf()
    counted = http.post(
        "/v1/responses/input_tokens", json={"model": MODEL, "input": hostile.pdf_input(pdf)}
    )
    assert counted.status_code == 200, counted.text
    answer = create(http, input=hostile.pdf_input(pdf, "Answer with its title only."))
    assert answer.status_code == 200, answer.text
    assert answer.json()["status"] in ("completed", "incomplete")


def test_a_bomb_without_its_xref_is_still_refused(http: httpx.Client) -> None:
    for pdf in (hostile.inflation_bomb(), hostile.text_bomb(2 << 20)):
        answer = create(http, input=hostile.pdf_input(hostile.without_xref(pdf)))
        refused(answer, "invalid_file", "input.0.content.1.file_data")


# -- a tool output must answer a call -------------------------------------------------------
CALL = {"type": "function_call", "call_id": "call_1", "name": "weather", "arguments": "{}"}


def output(call_id: str) -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": "sunny"}


def test_an_output_that_answers_no_call_is_refused(http: httpx.Client) -> None:
    alone = [{"role": "user", "content": "Weather?"}, output("call_9")]
    message = refused(create(http, input=alone), "invalid_value", "input.1.call_id")
    assert "call_9" in message
    before = [output("call_1"), CALL]  # the answer before its call answers nothing
    refused(create(http, input=before), "invalid_value", "input.0.call_id")
    chat = http.post(
        "/v1/chat/completions",
        json={
            "model": MODEL,
            "max_tokens": 4,
            "messages": [
                {"role": "user", "content": "Weather?"},
                {"role": "tool", "tool_call_id": "call_9", "content": "sunny"},
            ],
        },
    )
    assert chat.status_code == 400 and "call_9" in chat.text, chat.text


def test_an_output_answers_a_call_of_the_history_it_continues(http: httpx.Client) -> None:
    first = create(http, input=[{"role": "user", "content": "Weather?"}, CALL])
    assert first.status_code == 200, first.text
    previous = first.json()["id"]
    answered = create(http, previous_response_id=previous, input=[output("call_1")])
    assert answered.status_code == 200, answered.text
    # further down the chain, still found; an unknown id is not
    later = create(http, previous_response_id=answered.json()["id"], input=[output("call_1")])
    assert later.status_code == 200, later.text
    stray = create(http, previous_response_id=previous, input=[output("call_openresponses_x")])
    refused(stray, "invalid_value", "input.0.call_id")
