"""The prompts a shared tokenizer rendered last (engines/hosted.py, ``Prompts``): the
create's length check renders a prompt and its worker renders it again a moment later;
the second is a look-up. Only the same messages and tools hit, and what the caller does
with the list it got does not change what is kept."""

from __future__ import annotations

from typing import Any

from lmsp.engines.hosted import Prompts, Vocabularies


class Counting:
    """A tokenizer that counts its renders: a token a character of the messages."""

    n_ctx = 4096
    n_embd = 8
    n_vocab = 256

    def __init__(self) -> None:
        self.renders = 0
        self.closed = False

    def prompt_tokens(
        self, messages: list[dict[str, str]], tools: list[dict[str, Any]] | None = None
    ) -> list[int]:
        self.renders += 1
        text = "".join(m["role"] + m["content"] for m in messages) + str(tools or "")
        return [ord(c) % 256 for c in text]

    def text_tokens(self, text: str) -> list[int]:
        return [ord(c) % 256 for c in text]

    def close(self) -> None:
        self.closed = True


HELLO = [{"role": "user", "content": "hello"}]
TOOLS = [{"type": "function", "name": "f", "parameters": {"type": "object"}}]


def test_the_same_prompt_is_rendered_once_by_every_holder_of_the_tokenizer() -> None:
    vocabularies, tokenizer = Vocabularies(), Counting()
    first = vocabularies.shared(tokenizer).prompt_tokens(HELLO)
    again = vocabularies.shared(tokenizer).prompt_tokens([dict(m) for m in HELLO])
    assert first == again == tokenizer.prompt_tokens(HELLO)
    assert tokenizer.renders == 2  # once through the cache, once here directly
    first.append(999)  # the caller's list is its own
    assert vocabularies.shared(tokenizer).prompt_tokens(HELLO) == again


def test_other_messages_or_tools_are_rendered_again() -> None:
    vocabularies, tokenizer = Vocabularies(), Counting()
    shared = vocabularies.shared(tokenizer)
    shared.prompt_tokens(HELLO)
    shared.prompt_tokens([{"role": "user", "content": "hello!"}])
    with_tools = shared.prompt_tokens(HELLO, TOOLS)
    assert tokenizer.renders == 3
    assert with_tools != shared.prompt_tokens(HELLO)
    assert shared.prompt_tokens(HELLO, []) == shared.prompt_tokens(HELLO)  # no tools, alike
    assert tokenizer.renders == 3


def test_two_tokenizers_keep_their_own_prompts() -> None:
    vocabularies, one, other = Vocabularies(), Counting(), Counting()
    vocabularies.shared(one).prompt_tokens(HELLO)
    vocabularies.shared(other).prompt_tokens(HELLO)
    assert (one.renders, other.renders) == (1, 1)


def test_the_oldest_prompts_are_let_go_and_a_huge_one_is_not_kept() -> None:
    vocabularies, tokenizer = Vocabularies(), Counting()
    shared = vocabularies.shared(tokenizer)
    for i in range(Prompts.SIZE + 1):
        shared.prompt_tokens([{"role": "user", "content": f"m{i}"}])
    assert tokenizer.renders == Prompts.SIZE + 1
    shared.prompt_tokens([{"role": "user", "content": f"m{Prompts.SIZE}"}])  # kept
    shared.prompt_tokens([{"role": "user", "content": "m0"}])  # the oldest: let go
    assert tokenizer.renders == Prompts.SIZE + 2
    huge = [{"role": "user", "content": "x" * Prompts.LARGEST}]
    shared.prompt_tokens(huge)
    shared.prompt_tokens(huge)
    assert tokenizer.renders == Prompts.SIZE + 4
