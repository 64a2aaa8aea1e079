"""Legacy completions through the official ``openai`` SDK against a real ``lmsp serve``
running the real model: the prompt is read as raw text (no chat template), create and
stream agree."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from tests.helpers import Server, llama_tokens

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m-instruct"
COUNTING = "1, 2, 3, 4,"
CHATML = "<|im_start|>user\nSay hi.<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def sdk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[openai.OpenAI]:
    server = Server(tmp_path_factory.mktemp("completions-sdk") / "data").start()
    try:
        with openai.OpenAI(
            base_url=f"{server.url}/v1", api_key=server.token, max_retries=0, timeout=600
        ) as client:
            yield client
    finally:
        server.stop()


def raw_count(text: str, special: bool) -> int:
    """The prompt's tokens by llama.cpp itself, with no template."""
    return llama_tokens(text, special=special)


def test_the_prompt_is_continued_as_raw_text(sdk: openai.OpenAI) -> None:
    made = sdk.completions.create(model=MODEL, prompt=COUNTING, max_tokens=8, temperature=0)
    (choice,) = made.choices
    assert made.object == "text_completion" and choice.finish_reason == "length"
    # a continuation, not a chat answer: the numbers go on
    assert choice.text.startswith(" 5, 6"), choice.text
    assert made.usage is not None
    assert made.usage.prompt_tokens == raw_count(COUNTING, special=False)
    assert made.usage.completion_tokens == 8
    # special tokens in a prompt are read as such: a prompt may hold a template by hand
    chat = sdk.completions.create(model=MODEL, prompt=CHATML, max_tokens=4, temperature=0)
    assert chat.usage is not None
    assert chat.usage.prompt_tokens == raw_count(CHATML, special=True)
    assert chat.usage.prompt_tokens < raw_count(CHATML, special=False)


def test_a_stream_adds_up_to_the_completion(sdk: openai.OpenAI) -> None:
    whole = sdk.completions.create(
        model=MODEL, prompt=COUNTING, max_tokens=12, temperature=0, stop=["8"]
    )
    chunks = list(
        sdk.completions.create(
            model=MODEL,
            prompt=COUNTING,
            max_tokens=12,
            temperature=0,
            stop=["8"],
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text and text.endswith("7, ")
    reasons = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert reasons == ["stop"] == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert whole.usage is not None
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert all(c.id == chunks[0].id for c in chunks)
