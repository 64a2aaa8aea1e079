"""``POST /v1/embeddings`` in OpenAI's shapes: reading ``input``, writing the answer.

``input`` is one text, a list of texts, one token array (a list of token ids) or a list
of token arrays, as OpenAI's API takes it; nothing else, and no empty text or array.
The answer is ``{"object": "list", "data": [{"object": "embedding", "index", "embedding"}],
"model", "usage": {"prompt_tokens", "total_tokens"}}``; with ``encoding_format``
``base64`` each embedding is the base64 of its little-endian float32 values (what the
``openai`` SDK asks for by default and decodes with ``numpy.frombuffer``).
"""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING, Any

from lmsp.errors import LmspError

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

#: an input as read: a text, or token ids
Input = str | list[int]


def _invalid(message: str, param: str = "input") -> LmspError:
    return LmspError("invalid_value", message, param=param)


def _tokens(value: list[Any], param: str) -> list[int]:
    if not value:
        raise _invalid("An empty token array cannot be embedded.", param)
    for i, token in enumerate(value):
        if isinstance(token, bool) or not isinstance(token, int) or token < 0:
            raise _invalid("A token array holds token ids: integers from 0.", f"{param}.{i}")
    return value


def read_input(value: Any, max_inputs: int) -> tuple[list[Input], list[str]]:
    """The inputs of a request, in order, and how errors name each (``input`` for a
    lone text or token array, else ``input.3``); a ``400`` naming the one at fault for
    anything else, and for more than ``max_inputs`` of them."""
    lone = isinstance(value, str) or (
        isinstance(value, list) and bool(value) and all(isinstance(v, int) for v in value)
    )
    if isinstance(value, str):
        inputs: list[Input] = [value]
    elif isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        inputs = list(value)
    elif isinstance(value, list) and value and all(isinstance(v, int) for v in value):
        inputs = [_tokens(value, "input")]
    elif isinstance(value, list) and value and all(isinstance(v, list) for v in value):
        inputs = [_tokens(v, f"input.{i}") for i, v in enumerate(value)]
    elif isinstance(value, list) and not value:
        raise _invalid("input: at least one text (or token array) to embed.")
    else:
        raise _invalid(
            "input: a string, a list of strings, a token array (a list of token ids) or a"
            " list of token arrays."
        )
    if len(inputs) > max_inputs:
        raise _invalid(
            f"input: {len(inputs)} inputs; one request embeds at most {max_inputs} (the"
            " server's LMSP_EMBED_MAX_INPUTS). Send them in several requests."
        )
    names = ["input"] if lone else [f"input.{i}" for i in range(len(inputs))]
    for text, where in zip(inputs, names, strict=True):
        if isinstance(text, str) and not text:
            raise _invalid("An empty string cannot be embedded.", where)
    return inputs, names


def encoded(vector: npt.NDArray[np.float32], encoding_format: str) -> list[float] | str:
    """One embedding as ``float`` (a list of numbers) or ``base64`` (of float32 LE)."""
    if encoding_format == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return [float(x) for x in vector.tolist()]


def answer(
    model: str, vectors: npt.NDArray[np.float32], encoding_format: str, prompt_tokens: int
) -> dict[str, Any]:
    """The response body."""
    return {
        "object": "list",
        "data": [
            {"object": "embedding", "index": i, "embedding": encoded(row, encoding_format)}
            for i, row in enumerate(vectors)
        ],
        "model": model,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    }
