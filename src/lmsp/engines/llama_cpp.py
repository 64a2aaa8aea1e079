"""The real engine: llama-cpp-python running a GGUF model on the CPU.

Prompts are formatted with the model's own chat template. Tokens are sampled here
(:func:`lmsp.engines.base.sample`) from the logits llama.cpp computes, so sampling is
keyed by ``(seed, position)`` and a resumed task re-evaluates its prompt plus the tokens
of its snapshot and draws exactly what an uninterrupted run would.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from lmsp.engines.base import Constraint, EngineError, Piece, Sampling, Utf8Stream, sample
from lmsp.protocol import toolprompt

FALLBACK_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


_native_log = logging.getLogger("lmsp.llama_cpp")
_callback: Any = None  # kept referenced: llama.cpp holds a pointer to it


def _route_native_logs() -> None:
    """llama.cpp's own messages go to the logger ``lmsp.llama_cpp``: its errors as
    warnings, the rest (model metadata, ``n_ctx_train`` notes …) at debug level, so a
    server at the default level prints none of them. (llama-cpp-python's own callback
    prints some of them to stderr whatever ``verbose`` says.)"""
    global _callback
    if _callback is not None:
        return
    import ctypes

    import llama_cpp
    import llama_cpp.llama

    @llama_cpp.llama_log_callback  # type: ignore[untyped-decorator]
    def forward(level: int, text: bytes, user_data: Any) -> None:
        message = text.decode("utf-8", errors="replace").rstrip()
        if message:  # ggml: 1 debug, 2 info, 3 warn, 4 error, 5 continuation
            _native_log.log(logging.WARNING if level == 4 else logging.DEBUG, "%s", message)

    _callback = forward
    llama_cpp.llama_log_set(forward, ctypes.c_void_p(0))


def _threads() -> int:
    return max(1, int(os.environ.get("LMSP_THREADS", "0")) or (os.cpu_count() or 1))


class LlamaTokenizer:
    """The model's chat template and tokenizer; with ``vocab_only`` no weights load."""

    def __init__(self, path: Path, n_ctx: int, vocab_only: bool = True) -> None:
        from llama_cpp import Llama
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        _route_native_logs()

        self.llm: Any = Llama(
            model_path=str(path),
            n_ctx=n_ctx,
            n_threads=_threads(),
            n_threads_batch=_threads(),
            vocab_only=vocab_only,
            verbose=False,
        )
        meta: dict[str, str] = dict(self.llm.metadata)
        self.n_ctx = n_ctx
        if vocab_only and n_ctx <= 0:  # 0: the model's own training context
            arch = meta.get("general.architecture", "")
            self.n_ctx = int(meta.get(f"{arch}.context_length", "2048"))
        self.eos = int(self.llm.token_eos())
        self.stop_ids = {self.eos}
        eot = meta.get("tokenizer.ggml.eot_token_id")
        if eot is not None:
            self.stop_ids.add(int(eot))
        template = meta.get("tokenizer.chat_template") or FALLBACK_TEMPLATE
        self.template_tools = toolprompt.supports_tools(template)
        self._formatter = Jinja2ChatFormatter(
            template=template,
            eos_token=self._piece(self.eos),
            bos_token=self._piece(int(self.llm.token_bos())),
        )

    def _piece(self, token: int) -> str:
        return bytes(self.llm.detokenize([token], special=True)).decode("utf-8", errors="replace")

    def prompt_tokens(
        self, messages: list[dict[str, str]], tools: list[dict[str, Any]] | None = None
    ) -> list[int]:
        if tools and self.template_tools:
            formatted = self._formatter(
                messages=messages,  # type: ignore[arg-type]
                tools=toolprompt.template_tools(tools),  # type: ignore[arg-type]
            )
        else:
            messages = toolprompt.with_tools(messages, tools or [])
            formatted = self._formatter(messages=messages)  # type: ignore[arg-type]
        tokens: list[int] = self.llm.tokenize(
            formatted.prompt.encode("utf-8"), add_bos=False, special=True
        )
        return tokens

    def close(self) -> None:
        self.llm.close()


class LlamaModel(LlamaTokenizer):
    def __init__(self, path: Path, n_ctx: int) -> None:
        super().__init__(path, n_ctx, vocab_only=False)
        self.n_ctx = int(self.llm.n_ctx())
        self.n_vocab = int(self.llm.n_vocab())
        self._guidance: Any = None

    def guidance_tokenizer(self) -> Any:
        """The llguidance tokenizer of this model's vocabulary (built once, ~1 s)."""
        if self._guidance is None:
            import llama_cpp
            from llguidance.llamacpp import lltokenizer_from_vocab

            vocab = llama_cpp.llama_model_get_vocab(self.llm.model)
            self._guidance = lltokenizer_from_vocab(
                vocab, n_vocab=self.n_vocab, eos_token=sorted(self.stop_ids)
            )
        return self._guidance

    def _logits(self) -> np.ndarray[Any, np.dtype[np.float32]]:
        array: np.ndarray[Any, np.dtype[np.float32]] = np.ctypeslib.as_array(
            self.llm._ctx.get_logits(), shape=(self.n_vocab,)
        )
        return array

    def generate(
        self,
        prompt: list[int],
        resume: list[int],
        sampling: Sampling,
        constraint: Constraint | None = None,
    ) -> Iterator[Piece]:
        context = prompt + resume
        if len(context) >= self.n_ctx:
            raise EngineError("context_length_exceeded", "The conversation fills the context.")
        llm = self.llm
        llm.reset()
        llm.eval(prompt)
        for token in resume:  # one at a time, as first generated: the same arithmetic
            llm.eval([token])
            if constraint is not None:
                constraint.advance(token)
        decoder = Utf8Stream()
        if resume:  # hold back the bytes of a character the snapshot had not completed
            decoder.feed(bytes(llm.detokenize(resume)))
        position = len(resume)
        while llm.n_tokens < self.n_ctx:
            if constraint is not None and constraint.finished():
                return
            logits = self._logits()
            mask = None if constraint is None else constraint.allowed()
            if mask is not None:
                logits = np.where(mask, logits, np.float32(-np.inf))
            token = sample(logits, sampling, position)
            if token in self.stop_ids:
                return
            if constraint is not None:
                constraint.advance(token)
            text = decoder.feed(bytes(llm.detokenize([token])))
            yield Piece(token, text)
            position += 1
            llm.eval([token])


class LlamaEngine:
    name = "llama_cpp"

    def load(self, path: Path, n_ctx: int) -> LlamaModel:
        try:
            return LlamaModel(path, n_ctx)
        except (ValueError, RuntimeError, OSError) as exc:
            raise EngineError(
                "model_load_failed", f"llama.cpp could not load the model: {exc}"
            ) from exc

    def tokenizer(self, path: Path, n_ctx: int) -> LlamaTokenizer:
        return LlamaTokenizer(path, n_ctx)
