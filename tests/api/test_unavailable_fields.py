"""Each field of another API's body that lmsp does not have is refused by name
(``400 unsupported_parameter``), never ignored: the Responses, Chat Completions and
Messages bodies, every such field (declared once, :data:`lmsp.api.schemas.Unavailable`)."""

from __future__ import annotations

from typing import Any

import pytest

from lmsp.api.message_schemas import MessageCreate, check_message
from lmsp.api.schemas import ChatCompletionCreate, CreateResponse, check_chat, check_response
from lmsp.errors import LmspError

RESPONSES = (
    "prompt",
    "prompt_cache_retention",
    "prompt_cache_options",
    "background_options",
    "moderation",
    "image",
    "access_programs",
)
CHAT = (
    "audio",
    "prediction",
    "functions",
    "function_call",
    "web_search_options",
    "prompt_cache_retention",
    "prompt_cache_options",
    "moderation",
)
MESSAGES = (
    "mcp_servers",
    "container",
    "inference_geo",
    "diagnostics",
    "user_profile_id",
    "workspace_id",
)


def _refused(check: Any, body: Any) -> LmspError:
    with pytest.raises(LmspError) as caught:
        check(body)
    return caught.value


@pytest.mark.parametrize("name", RESPONSES)
def test_a_responses_field_lmsp_has_not_is_refused(name: str) -> None:
    body = CreateResponse.model_validate({"model": "m", "input": "hi", name: {"x": 1}})
    error = _refused(check_response, body)
    assert (error.code, error.param) == ("unsupported_parameter", name)


@pytest.mark.parametrize("name", CHAT)
def test_a_chat_field_lmsp_has_not_is_refused(name: str) -> None:
    given = {"model": "m", "messages": [{"role": "user", "content": "hi"}], name: "x"}
    error = _refused(check_chat, ChatCompletionCreate.model_validate(given))
    assert (error.code, error.param) == ("unsupported_parameter", name)


@pytest.mark.parametrize("name", MESSAGES)
def test_a_messages_field_lmsp_has_not_is_refused(name: str) -> None:
    given = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    error = _refused(check_message, MessageCreate.model_validate({**given, name: [1]}))
    assert (error.code, error.param) == ("unsupported_parameter", name)


def test_the_first_declared_is_named_first_and_null_is_no_value() -> None:
    given = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    body = ChatCompletionCreate.model_validate({**given, "moderation": 1, "audio": 1})
    assert _refused(check_chat, body).param == "audio"
    check_chat(ChatCompletionCreate.model_validate({**given, "audio": None}))
