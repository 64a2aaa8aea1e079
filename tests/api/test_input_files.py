"""A file is read as text once, when it is uploaded: the size check, the runner and every
later turn use the stored text (issue 17, finding 3); and no file ever gives a 500."""

from __future__ import annotations

import base64
from typing import Any, NoReturn

import pytest
from fastapi.testclient import TestClient

from lmsp.protocol import items
from tests.helpers import tiny_pdf

BODY: dict[str, Any] = {"model": "lmsp-test", "max_output_tokens": 5}


def pdf_input(pdf: bytes) -> list[dict[str, Any]]:
    data = f"data:application/pdf;base64,{base64.b64encode(pdf).decode()}"
    return [
        {
            "role": "user",
            "content": [
                {"type": "input_text", "text": "Read it."},
                {"type": "input_file", "filename": "doc.pdf", "file_data": data},
            ],
        }
    ]


def test_a_file_is_read_once_for_all_turns(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    def read_again(*args: Any, **kwargs: Any) -> NoReturn:
        raise AssertionError("a file was read again")

    monkeypatch.setattr(items, "file_text", read_again)  # the only other way to read one
    svc = client.app.state.lmsp  # type: ignore[attr-defined]
    pdf = tiny_pdf("The code word is OKAPI.")
    first = client.post("/v1/responses", json={**BODY, "input": pdf_input(pdf)})
    assert first.status_code == 200, first.text
    previous = first.json()["id"]
    for turn in range(3):
        answer = client.post(
            "/v1/responses",
            json={**BODY, "input": f"turn {turn}", "previous_response_id": previous},
        )
        assert answer.json()["task"]["status"] == "completed", answer.text
        previous = answer.json()["id"]
    assert svc.files.parsed == 1
    # the same file uploaded again (a new conversation) is known: not parsed again
    again = client.post("/v1/responses", json={**BODY, "input": pdf_input(pdf)})
    assert again.status_code == 200 and svc.files.parsed == 1
    page = client.get(f"/v1/responses/{previous}/input_items", params={"order": "asc"}).json()
    part = page["data"][0]["content"][1]
    assert part["type"] == "input_file" and items.FILE_TEXT not in part  # as it was given


@pytest.mark.parametrize(
    ("filename", "data", "code"),
    [
        ("deep.json", b"[" * 200_000 + b"]" * 200_000, "invalid_file"),
        ("latin.txt", "caf\xe9".encode("latin-1"), "invalid_file"),
        ("doc.pdf", b"%PDF-1.7\n" + b"\x00" * 5000, "invalid_file"),
        ("empty.pdf", tiny_pdf(""), "unsupported_input"),
    ],
)
def test_unreadable_files_are_400s_naming_the_part(
    client: TestClient, filename: str, data: bytes, code: str
) -> None:
    given = [
        {
            "role": "user",
            "content": [
                {
                    "type": "input_file",
                    "filename": filename,
                    "file_data": base64.b64encode(data).decode(),
                }
            ],
        }
    ]
    answer = client.post("/v1/responses", json={**BODY, "input": given})
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert (error["code"], error["param"]) == (code, "input.0.content.0.file_data")


def test_a_chat_file_error_names_its_message(client: TestClient) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
        {
            "role": "user",
            "content": [
                {"type": "file", "file": {"filename": "a.json", "file_data": "e25vcGU="}},
            ],
        },
    ]
    answer = client.post("/v1/chat/completions", json={"model": "lmsp-test", "messages": messages})
    error = answer.json()["error"]
    assert (error["code"], error["param"]) == ("invalid_file", "messages.3.content.0.file_data")
