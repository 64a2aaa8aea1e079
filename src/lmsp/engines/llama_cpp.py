"""The real engine: llama-cpp-python running a GGUF model on the CPU.

Prompts are formatted with the model's own chat template. Tokens are sampled here
(:func:`lmsp.engines.base.sample`) from the logits llama.cpp computes, so sampling is
keyed by ``(seed, position)`` and a resumed task re-evaluates its prompt plus the tokens
of its snapshot and draws exactly what an uninterrupted run would.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from lmsp.engines import markers
from lmsp.engines.base import (
    Constraint,
    EngineError,
    Generation,
    LoadOptions,
    Piece,
    Sampling,
    Utf8Stream,
    sample,
    top_logprobs,
)
from lmsp.engines.batch import CHUNK, Batcher, Logits, SequencePool, Slot
from lmsp.engines.kvfiles import PrefixFiles
from lmsp.engines.llama_context import LlamaContext
from lmsp.protocol import completions, toolprompt

FALLBACK_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


log = logging.getLogger(__name__)
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


def _tag() -> str:
    """What saved KV bytes depend on besides the model: llama.cpp's state format (its
    version) and the cache layout lmsp creates."""
    from importlib.metadata import version

    return f"llama-cpp-python {version('llama-cpp-python')}; f16 kv; flash attention"


TAG = _tag()


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
        raw = completions.raw_prompt(messages)
        if raw is not None:  # a text completion's prompt: as given, without the template
            return self.raw_tokens(raw)
        # content is plain text: only the template's own markers are control tokens
        return markers.prompt_tokens(self, messages, tools)

    def raw_tokens(self, text: str) -> list[int]:
        """``text`` as the model reads a raw prompt: a BOS token if the model asks for one,
        special tokens (``<|im_start|>`` …) read as such, as llama.cpp's server does."""
        tokens: list[int] = self.llm.tokenize(text.encode("utf-8"), add_bos=True, special=True)
        return tokens

    def close(self) -> None:
        self.llm.close()


class LlamaModel(LlamaTokenizer):
    """A loaded model: one llama.cpp context whose sequences several tasks step
    together (:mod:`lmsp.engines.batch`). Each task samples its own tokens in its own
    thread; the model's forward passes are shared.

    A task's prompt starts from the longest prefix already in a free sequence (a
    finished task's), else from the longest saved on disk
    (:class:`lmsp.engines.kvfiles.PrefixFiles`), and evaluates only the rest, in chunks
    of :data:`CHUNK` tokens. Saved to disk, for the next turn or for after a restart: a
    long prefix two prompts share (a system prompt, tool definitions), a long prompt
    once evaluated, and a long generation every ``save_every`` tokens (its resume).
    """

    #: tokens evaluated before a prompt is worth saving; tokens between saves of a
    #: long generation (a resume then re-evaluates at most this many)
    save_after = 256
    save_every = 128

    def __init__(self, path: Path, n_ctx: int, options: LoadOptions | None = None) -> None:
        super().__init__(path, n_ctx, vocab_only=True)
        options = options or LoadOptions()
        self.context = LlamaContext(path, n_ctx, options.sequences, _threads())
        self.n_ctx = self.context.n_ctx
        self.n_vocab = self.context.n_vocab
        self.batcher = Batcher(self.context.decode, max_tokens=self.context.max_tokens)
        self.pool = SequencePool(self.context.sequences)
        self.digest = options.digest
        self.prefix_files: PrefixFiles | None = options.prefix_files if options.digest else None
        self._saver = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="lmsp-kv")
        self._saved: set[tuple[int, int]] = set()  # (length, hash) saved by this process
        self._guidance: Any = None

    def guidance_tokenizer(self) -> Any:
        """The llguidance tokenizer of this model's vocabulary (built once, ~1 s)."""
        if self._guidance is None:
            from llguidance.llamacpp import lltokenizer_from_vocab

            with warnings.catch_warnings():  # it reads each token's attributes by an old name
                warnings.simplefilter("ignore", DeprecationWarning)
                self._guidance = lltokenizer_from_vocab(
                    self.context.vocab, n_vocab=self.n_vocab, eos_token=sorted(self.stop_ids)
                )
        return self._guidance

    def memory_bytes(self) -> int:
        """The model's tensors plus the KV cache of every sequence, as ``lmsp ps`` shows."""
        return self.context.memory_bytes()

    def generate(
        self,
        prompt: list[int],
        resume: list[int],
        sampling: Sampling,
        constraint: Constraint | None = None,
    ) -> Generation:
        if len(prompt) + len(resume) >= self.n_ctx:
            raise EngineError("context_length_exceeded", "The conversation fills the context.")
        generation = Generation()
        return generation.run(self._pieces(generation, prompt, resume, sampling, constraint))

    def _start(self, slot: Slot, choice_cached: int, context: list[int]) -> tuple[int, bool]:
        """Make ``slot`` hold the longest available prefix of ``context``, at most all
        but its last token (whose logits are needed): how many tokens it holds, and
        whether they came from disk."""
        cached = choice_cached
        files = self.prefix_files
        saved = None
        if files is not None and len(context) - cached > 2 * CHUNK:
            saved = files.best(self.digest, context, min_tokens=cached + 2 * CHUNK, tag=TAG)
        with self.batcher.exclusive():
            if saved is not None:
                if self.context.restore(slot.seq, saved[1]):
                    cached = saved[0]
                else:
                    log.warning("a saved prefix of %d tokens was refused", saved[0])
                    cached, saved = 0, None
            keep = min(cached, len(context) - 1)
            self.context.trim(slot.seq, keep)
        return keep, saved is not None

    def _pieces(
        self,
        generation: Generation,
        prompt: list[int],
        resume: list[int],
        sampling: Sampling,
        constraint: Constraint | None,
    ) -> Iterator[Piece]:
        context = prompt + resume
        choice = self.pool.take(context)
        slot = choice.slot
        held: list[int] = []  # what the sequence's cache holds, position by position
        try:
            with self.batcher.sequence():
                keep, from_disk = self._start(slot, choice.cached, context)
                held = context[:keep]
                self.pool.hold(slot, held)  # grows as the sequence is evaluated
                generation.cached_tokens = min(keep, len(prompt))
                if keep >= self.save_after and not from_disk:
                    self._save(slot.seq, held)  # a prefix two prompts share: a hot one
                logits = self._evaluate(slot.seq, context, held)
                if len(context) - keep >= self.save_after:
                    self._save(slot.seq, held)  # the next turn starts with all of it
                yield from self._sample(slot.seq, logits, held, resume, sampling, constraint)
        except Exception:
            held = []  # the cache may hold a half-evaluated step: trust none of it
            self.pool.hold(slot, held)
            raise
        finally:
            if not held:
                with self.batcher.exclusive():
                    self.context.trim(slot.seq, 0)
            self.pool.give_back(slot, held)

    def _evaluate(self, seq: int, context: list[int], held: list[int]) -> Logits:
        """Evaluate ``context`` after what ``held`` has, chunk by chunk; the logits of
        its last token."""
        logits: Logits | None = None
        while len(held) < len(context):
            part = context[len(held) : len(held) + CHUNK]
            last = len(held) + len(part) == len(context)
            logits = self.batcher.decode(seq, part, len(held), last)
            held.extend(part)
        assert logits is not None
        return logits

    def _save(self, seq: int, held: list[int]) -> None:
        """Save the sequence's cache for ``held`` to disk, written off this thread."""
        files = self.prefix_files
        key = (len(held), hash(tuple(held)))
        if files is None or key in self._saved:
            return
        if len(self._saved) >= 4096:  # a guard against saving again, not a record: bounded
            self._saved.clear()
        self._saved.add(key)
        with self.batcher.exclusive():
            data = self.context.save(seq)
        self._saver.submit(files.save, self.digest, list(held), data, tag=TAG)

    def _sample(
        self,
        seq: int,
        logits: Logits,
        held: list[int],
        resume: list[int],
        sampling: Sampling,
        constraint: Constraint | None,
    ) -> Iterator[Piece]:
        if constraint is not None:
            for token in resume:
                constraint.advance(token)
        decoder = Utf8Stream()
        if resume:  # hold back the bytes of a character the snapshot had not completed
            decoder.feed(bytes(self.llm.detokenize(resume)))
        position = len(resume)
        generated = list(resume)  # what the penalties count
        saved_at = len(held)
        while len(held) < self.n_ctx:
            if constraint is not None and constraint.finished():
                return
            mask = None if constraint is None else constraint.allowed()
            if mask is not None:
                logits = np.where(mask, logits, np.float32(-np.inf))
            token = sample(logits, sampling, position, generated)
            if token in self.stop_ids:
                return
            if constraint is not None:
                constraint.advance(token)
            raw = bytes(self.llm.detokenize([token]))
            text = decoder.feed(raw)
            yield Piece(token, text, self._logprobs(logits, token, raw, sampling))
            position += 1
            generated.append(token)
            if len(held) + 1 > self.n_ctx:  # no room for the token just drawn
                return
            result = self.batcher.decode(seq, [token], len(held), True)
            assert result is not None
            logits = result
            held.append(token)
            if self.prefix_files is not None and len(held) - saved_at >= self.save_every:
                self._save(seq, held)
                saved_at = len(held)

    def _logprobs(
        self, logits: Logits, token: int, raw: bytes, sampling: Sampling
    ) -> dict[str, Any] | None:
        if not sampling.logprobs:
            return None
        chosen, best = top_logprobs(logits, token, sampling.top_logprobs)

        def entry(tok: int, logprob: float, data: bytes | None = None) -> dict[str, Any]:
            data = bytes(self.llm.detokenize([tok])) if data is None else data
            text = data.decode("utf-8", errors="replace")
            return {"token": text, "logprob": logprob, "bytes": list(data)}

        return {
            **entry(token, chosen, raw),
            "top_logprobs": [entry(tok, logprob) for tok, logprob in best],
        }

    def close(self) -> None:
        self.batcher.close()
        self._saver.shutdown(wait=True)
        self.context.close()
        super().close()


class LlamaEngine:
    name = "llama_cpp"

    def load(self, path: Path, n_ctx: int, options: LoadOptions | None = None) -> LlamaModel:
        try:
            return LlamaModel(path, n_ctx, options)
        except (ValueError, RuntimeError, OSError) as exc:  # its words (paths) to the log
            log.warning("llama.cpp could not load %s: %s", path.name, exc)
            raise EngineError("model_load_failed", "llama.cpp could not load the model.") from exc

    def tokenizer(self, path: Path, n_ctx: int) -> LlamaTokenizer:
        return LlamaTokenizer(path, n_ctx)
