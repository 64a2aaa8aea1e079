"""The real engine: llama-cpp-python running a GGUF model on the CPU.

Prompts are formatted with the model's own chat template (:class:`LlamaTokenizer`, in
the API process: it loads the vocabulary only). The model itself (:class:`LlamaModel`)
lives in an engine process. Tokens are sampled there (:func:`lmsp.engines.base.sample`)
from the logits llama.cpp computes, so sampling is keyed by ``(seed, position)`` and a
resumed task re-evaluates its prompt plus the tokens of its snapshot and draws exactly
what an uninterrupted run would.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import logging
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmsp.config import engine_threads
from lmsp.engines import markers
from lmsp.engines.base import (
    Constraint,
    EngineError,
    LoadOptions,
    Piece,
    Utf8Stream,
    context_size,
    sample,
    top_logprobs,
)
from lmsp.engines.batch import CHUNK, Logits, Request, SequencePool, Slot
from lmsp.engines.core import Seq
from lmsp.engines.kvfiles import PrefixFiles
from lmsp.engines.llama_context import EXACT, FAST, LlamaContext, load_model, yarn_factor
from lmsp.engines.llama_embed import LlamaEmbedder
from lmsp.engines.llama_vocab import ModelVocab
from lmsp.protocol import completions, toolprompt

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

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

    # "no split-kv": since single tokens never take the split-KV kernel (LlamaModel.decode)
    return f"llama-cpp-python {version('llama-cpp-python')}; f16 kv; flash attention; no split-kv"


#: the tag of prefixes saved in exact mode, whose bits a resume relies on
TAG = _tag()
#: fast mode's: its prefixes were evaluated in full micro-batches, so an exact-mode
#: engine never starts from one (a prefix met under the other mode's tag is replaced)
FAST_TAG = TAG + "; fast"

#: a lone stream's cache size from which llama.cpp's CPU flash attention may decode a
#: single token with its split-KV kernel (it does from 512 padded cells, i.e. more
#: than 256 used; a margin below that)
SPLIT_KV_CELLS = 192


def _context_of(meta: Mapping[str, Any], n_ctx: int, options: LoadOptions) -> int:
    """One sequence's context for a model of these GGUF metadata (see
    :func:`lmsp.engines.base.context_size`): its KV bytes a token (K and V, 16-bit, every
    layer) from the same fields llama.cpp sizes its cache by."""
    arch = meta.get("general.architecture", "")

    def number(key: str, default: int) -> int:
        return int(meta.get(f"{arch}.{key}", str(default)))

    trained = number("context_length", 2048)
    heads = max(1, number("attention.head_count", 1))
    width = number("embedding_length", 0)
    kv_heads = number("attention.head_count_kv", heads)
    key_width = number("attention.key_length", width // heads) * kv_heads
    value_width = number("attention.value_length", width // heads) * kv_heads
    per_token = number("block_count", 0) * (key_width + value_width) * 2
    streams = spare_streams(options)
    return context_size(n_ctx, trained, streams, per_token, options.kv_budget)


def yarn_base(meta: dict[str, str], n_ctx: int, options: LoadOptions) -> int:
    """The trained context a YaRN rope scaling stretches to ``n_ctx`` (one sequence's),
    or 0 for none. A context past the one a model was trained on gives positions it never
    saw: without scaling its output past that point is noise (SmolLM2-135M, trained on
    8,192 tokens, wrote 7,000 tokens of it after Claude Code's 21k-token prompt); with
    YaRN (llama.cpp's, as ``llama-server --rope-scaling yarn``) it answers. Applied when
    ``n_ctx`` exceeds the trained context, the model declares no scaling of its own
    (``{arch}.rope.scaling.type``) and ``LMSP_ROPE_SCALING`` is not ``none``."""
    arch = meta.get("general.architecture", "")
    trained = int(meta.get(f"{arch}.context_length", "0"))
    declared = meta.get(f"{arch}.rope.scaling.type", "none")
    if not options.rope_scaling or trained <= 0 or n_ctx <= trained:
        return 0
    return trained if declared in ("", "none") else 0


def spare_streams(options: LoadOptions) -> int:
    """The KV streams a context of ``options`` holds: one a sequence, and in exact mode a
    spare one beside a lone sequence (its fillers, see :meth:`LlamaModel.decode`)."""
    sequences = max(1, options.sequences)
    return sequences + 1 if options.exact and sequences == 1 else sequences


class LlamaTokenizer:
    """The model's chat template and tokenizer; with ``vocab_only`` no weights load."""

    def __init__(
        self,
        path: Path,
        n_ctx: int,
        vocab_only: bool = True,
        options: LoadOptions | None = None,
        *,
        loaded: ModelVocab | None = None,
    ) -> None:
        """``loaded``: the vocabulary of a model an engine loaded already, read through it
        (:mod:`lmsp.engines.llama_vocab`) instead of loading the file here."""
        from llama_cpp import Llama
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        _route_native_logs()

        self.llm: Any = loaded or Llama(
            model_path=str(path),
            # the tokenizer's own context holds nothing (0 would make llama.cpp refuse it)
            n_ctx=n_ctx if n_ctx > 0 else 512,
            n_threads=engine_threads(),
            n_threads_batch=engine_threads(),
            vocab_only=vocab_only,
            verbose=False,
        )
        meta: dict[str, str] = dict(self.llm.metadata)
        self.meta = meta
        arch = meta.get("general.architecture", "")
        # an embedding's length (the metadata's: a vocabulary-only load knows no sizes)
        self.n_embd = int(meta.get(f"{arch}.embedding_length", "0"))
        self.n_vocab = int(self.llm.n_vocab())
        import llama_cpp

        self.vocab = llama_cpp.llama_model_get_vocab(self.llm.model)
        self._pieces: dict[tuple[int, bool], bytes] = {}
        self.n_ctx = n_ctx
        if vocab_only:  # the context the engine sizes from the same options
            self.n_ctx = _context_of(meta, n_ctx, options or LoadOptions())
        self.eos = int(self.llm.token_eos())
        self.stop_ids = {self.eos}
        eot = meta.get("tokenizer.ggml.eot_token_id")
        if eot is not None:
            self.stop_ids.add(int(eot))
        template = meta.get("tokenizer.chat_template") or FALLBACK_TEMPLATE
        self.template_tools = toolprompt.supports_tools(template)
        self.control_markers: markers.Markers | None = None  # read when first needed
        self.formatter = Jinja2ChatFormatter(
            template=template,
            eos_token=self._piece(self.eos),
            bos_token=self._piece(int(self.llm.token_bos())),
        )

    def _piece(self, token: int) -> str:
        return self.piece(token, special=True).decode("utf-8", errors="replace")

    def piece(self, token: int, special: bool = False) -> bytes:
        """``token``'s bytes as the model writes it (a control token's: none unless
        ``special``), read once. Not llama-cpp-python's ``detokenize``: its 32-byte buffer
        turns a longer piece (a run of 33 spaces is one token of SmolLM2's) into stale
        bytes."""
        found = self._pieces.get((token, special))
        if found is None:
            import llama_cpp

            size = 64
            while True:
                buf = ctypes.create_string_buffer(size)
                n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, size, 0, special)
                if n >= 0:
                    break
                size = -n
            found = self._pieces[(token, special)] = buf.raw[:n]
        return found

    def text_of(self, tokens: list[int]) -> bytes:
        """The bytes of generated ``tokens`` (:meth:`piece` of each, joined)."""
        return b"".join(self.piece(t) for t in tokens)

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

    def text_tokens(self, text: str) -> list[int]:
        """``text`` as an embedding reads it: as llama-server tokenizes an input."""
        return self.raw_tokens(text)

    def close(self) -> None:
        self.llm.close()


@dataclass(eq=False)
class _Sequence:
    """What the llama backend keeps of one sequence."""

    slot: Slot
    constraint: Constraint | None
    decoder: Utf8Stream
    generated: list[int]  # the snapshot's tokens and those drawn since: what penalties count
    kept: int  # tokens its cache held when it started
    generating: bool = False
    saved_at: int = 0  # ``held`` length at the last save
    due: list[int] = field(default_factory=list)  # lengths of ``held`` to save once sent


class LlamaModel(LlamaTokenizer):
    """A loaded model in its engine process: one llama.cpp context whose sequences the
    engine core steps together (:mod:`lmsp.engines.core`), and what each sequence needs
    between steps — its sampler keyed by ``(seed, position)``, its grammar's mask
    (llguidance, compiled here from the grammar text and cached by it), its text.

    A sequence starts from the longest prefix already in a free sequence of the context
    (a finished task's), else from the longest saved on disk
    (:class:`lmsp.engines.kvfiles.PrefixFiles`), and evaluates only the rest. Saved to
    disk, for the next turn or for after a restart: a long prefix two prompts share (a
    system prompt, tool definitions), a long prompt once evaluated, and a long generation
    every ``save_every`` tokens (its resume).
    """

    #: tokens evaluated before a prompt is worth saving; tokens between saves of a
    #: long generation (a resume then re-evaluates at most this many)
    save_after = 256
    save_every = 128

    def __init__(self, path: Path, n_ctx: int, options: LoadOptions | None = None) -> None:
        options = options or LoadOptions()
        _route_native_logs()
        model = load_model(path)  # once: the tokenizer reads its vocabulary through it
        try:
            super().__init__(path, n_ctx, options=options, loaded=ModelVocab(model))
            self.exact = options.exact
            layout = EXACT if options.exact else FAST
            self.yarn_from = yarn_base(self.meta, self.n_ctx, options)
        except BaseException:
            import llama_cpp

            llama_cpp.llama_model_free(model)
            raise
        self.context = LlamaContext(
            model, self.n_ctx, options.sequences, engine_threads(), layout, yarn_from=self.yarn_from
        )
        self.tag = TAG if options.exact else FAST_TAG
        if self.yarn_from:  # saved cells hold positions rotated for this context only
            factor = yarn_factor(self.n_ctx, self.yarn_from)
            self.tag += f";yarn-{self.yarn_from}x{factor}"
            log.info(
                "a context of %d tokens, past the model's trained %d: YaRN rope scaling x%d",
                self.n_ctx,
                self.yarn_from,
                factor,
            )
        self.n_ctx = self.context.n_ctx
        self.n_vocab = self.context.n_vocab
        self.sequences = self.context.sequences
        self.max_step_tokens = self.context.max_tokens
        self.pool = SequencePool(self.context.sequences)
        self.digest = options.digest
        self.prefix_files: PrefixFiles | None = options.prefix_files if options.digest else None
        self._saver = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="lmsp-kv")
        self._saved: set[tuple[int, int]] = set()  # (length, hash) saved by this process
        self._guidance: Any = None
        self.embed_tokens = options.embed_tokens
        self._embedder: LlamaEmbedder | None = None

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

    def constraint(self, grammar: str) -> Constraint:
        """A fresh matcher of ``grammar`` (compiled once per grammar text, then copied)."""
        from lmsp.engines.matcher import GrammarConstraint, compiled

        return GrammarConstraint(compiled(self.guidance_tokenizer(), grammar), self.n_vocab)

    def memory_bytes(self) -> int:
        """The model's tensors plus the KV cache of every sequence, as ``lmsp ps`` shows."""
        return self.context.memory_bytes()

    # -- the engine core's calls (one thread) -----------------------------------------
    def open(self, seq: Seq) -> None:
        context = seq.context
        if len(context) >= self.n_ctx:
            raise EngineError("context_length_exceeded", "The conversation fills the context.")
        constraint = None if seq.grammar is None else self.constraint(seq.grammar)
        if constraint is not None:
            for token in seq.resume:
                constraint.advance(token)
        decoder = Utf8Stream()
        if seq.resume:  # hold back the bytes of a character the snapshot had not completed
            decoder.feed(self.text_of(seq.resume))
        choice = self.pool.take(context)
        keep, from_disk = self._start(choice.slot, choice.cached, context)
        seq.slot = choice.slot.seq
        seq.held = context[:keep]
        self.pool.hold(choice.slot, seq.held)  # grows as the sequence is evaluated
        seq.cached = min(keep, len(seq.prompt))
        seq.state = _Sequence(choice.slot, constraint, decoder, list(seq.resume), keep)
        if keep >= self.save_after and not from_disk:
            seq.state.due.append(keep)  # a prefix two prompts share: a hot one

    def _start(self, slot: Slot, choice_cached: int, context: list[int]) -> tuple[int, bool]:
        """Make ``slot`` hold the longest available prefix of ``context``, at most all
        but its last token (whose logits are needed): how many tokens it holds, and
        whether they came from disk."""
        cached = choice_cached
        files = self.prefix_files
        saved = None
        if files is not None and len(context) - cached > 2 * CHUNK:
            saved = files.best(self.digest, context, min_tokens=cached + 2 * CHUNK, tag=self.tag)
        if saved is not None:
            if self.context.restore(slot.seq, saved[1]):
                cached = saved[0]
            else:
                log.warning("a saved prefix of %d tokens was refused", saved[0])
                cached, saved = 0, None
        keep = min(cached, len(context) - 1)
        self.context.trim(slot.seq, keep)
        return keep, saved is not None

    def decode(self, step: list[Request]) -> None:
        """Run a step. A step of single tokens gets filler tokens (appended to other
        sequences' caches and removed right after) so that its sequences form one run
        of consecutive ids of at least two streams when that matters:

        - llama.cpp's CPU flash attention decodes a lone query token of a lone stream
          over 512 or more cache cells with another kernel (``use_split_kv_path``:
          the cells split across threads, partial sums merged) than every other shape,
          so a token generated alone would differ in its last bits from the same token
          generated beside others, or re-evaluated in a chunk on resume (measured);
        - the sequences of a step form one micro-batch, one forward pass, only when
          their ids are consecutive: a filler in a gap costs one token, a second pass
          costs the whole model.

        In fast mode only the gaps get fillers (a lone sequence takes whichever kernel
        llama.cpp picks, as in llama-server)."""
        if all(len(r.tokens) == 1 for r in step):
            fillers = single_step_fillers(
                step, self.context.streams, self.context.positions, self.exact
            )
            if fillers:
                try:
                    self.context.decode(step + fillers)
                finally:
                    for filler in fillers:
                        self.context.trim(filler.seq, filler.pos)
                return
        self.context.decode(step)

    def evaluated(self, seq: Seq) -> None:
        state: _Sequence = seq.state
        if not state.generating:
            if seq.todo:
                return  # more of the prompt to come
            state.generating = True
            if len(seq.context) - state.kept >= self.save_after:
                state.due.append(len(seq.held))  # the next turn starts with all of it
            state.saved_at = len(seq.held)
        elif self.prefix_files is not None and len(seq.held) - state.saved_at >= self.save_every:
            state.due.append(len(seq.held))
            state.saved_at = len(seq.held)

    def pick(self, seq: Seq, logits: Logits) -> Piece | None:
        import numpy as np

        state: _Sequence = seq.state
        constraint = state.constraint
        if constraint is not None and constraint.finished():
            return None
        mask = None if constraint is None else constraint.allowed()
        if mask is not None:
            logits = np.where(mask, logits, np.float32(-np.inf))
        token = sample(logits, seq.sampling, len(state.generated), state.generated)
        if token in self.stop_ids:
            return None
        if constraint is not None:
            constraint.advance(token)
        raw = self.piece(token)
        state.generated.append(token)
        return Piece(token, state.decoder.feed(raw), self._logprobs(logits, token, raw, seq))

    def sent(self, seqs: list[Seq]) -> None:
        """Save what is due once a sequence's first token is out: a save copies the
        sequence's whole cache out of the context (tens of MB for a long prompt), which
        would otherwise come before that token."""
        for seq in seqs:
            state: _Sequence | None = seq.state
            if state is not None and state.due and state.generating and seq.reported:
                self._save_due(seq, state)

    def release(self, seq: Seq, intact: bool) -> None:
        state: _Sequence | None = seq.state
        if state is None:
            return
        if intact and state.due:  # ended before its saves were sent: its slot is reused next
            self._save_due(seq, state)
        held = seq.held if intact else []  # after a failed step: trust none of it
        if not held:
            self.context.trim(state.slot.seq, 0)
        self.pool.give_back(state.slot, held)

    def embed(
        self, inputs: list[list[int]], max_tokens: int | None = None
    ) -> npt.NDArray[np.float32]:
        """Embeddings, in a context of their own made on first use (:mod:`lmsp.engines.
        llama_embed`); a model that cannot embed is refused each time it is asked."""
        if self._embedder is None:
            self._embedder = LlamaEmbedder(self.context.model, self.embed_tokens, engine_threads())
        return self._embedder.embed(inputs, max_tokens)

    def figures(self) -> dict[str, Any]:
        files = self.prefix_files
        return {
            "sequences": self.pool.snapshot(),
            "prefix_cache": dict(files.counts) if files is not None else {},
        }

    def _save_due(self, seq: Seq, state: _Sequence) -> None:
        """Save the prefixes of ``held`` that are due, written off the loop. The cache is
        copied out once: a prefix's file may hold cells past its tokens, which a restore
        trims (:meth:`_start`); the cells of a prefix do not depend on what follows."""
        files = self.prefix_files
        due, state.due = state.due, []
        if files is None:
            return
        data: bytes | None = None
        for n in sorted(set(due)):
            held = seq.held[:n]
            key = (n, hash(tuple(held)))
            if key in self._saved:
                continue
            if len(self._saved) >= 4096:  # a guard against saving again, not a record
                self._saved.clear()
            self._saved.add(key)
            if data is None:
                data = self.context.save(seq.slot)
            self._saver.submit(files.save, self.digest, held, data, tag=self.tag)

    def _logprobs(self, logits: Logits, token: int, raw: bytes, seq: Seq) -> dict[str, Any] | None:
        sampling = seq.sampling
        if not sampling.logprobs:
            return None
        chosen, best = top_logprobs(logits, token, sampling.top_logprobs)

        def entry(tok: int, logprob: float, data: bytes | None = None) -> dict[str, Any]:
            data = self.piece(tok) if data is None else data
            text = data.decode("utf-8", errors="replace")
            return {"token": text, "logprob": logprob, "bytes": list(data)}

        return {
            **entry(token, chosen, raw),
            "top_logprobs": [entry(tok, logprob) for tok, logprob in best],
        }

    def close(self) -> None:
        self._saver.shutdown(wait=True)
        if self._embedder is not None:
            self._embedder.close()
        self.context.close()
        super().close()


def single_step_fillers(
    step: list[Request], streams: int, positions: Callable[[int], int], exact: bool = True
) -> list[Request]:
    """The filler tokens a step of single tokens needs (see :meth:`LlamaModel.decode`):
    one in every gap between its sequence ids, and (``exact``) beside a lone sequence
    whose cache reaches :data:`SPLIT_KV_CELLS` one in the neighbouring stream holding
    the least. ``positions(seq)``: how many positions a stream holds (a filler goes
    after them)."""
    seqs = {r.seq for r in step}
    low, high = min(seqs), max(seqs)
    missing = [s for s in range(low, high + 1) if s not in seqs]
    if exact and len(seqs) == 1 and step[0].pos + 1 >= SPLIT_KV_CELLS:
        around = [s for s in (low - 1, high + 1) if 0 <= s < streams]
        missing.append(min(around, key=positions))
    return [Request(s, [0], positions(s), False) for s in missing]


class LlamaEngine:
    name = "llama_cpp"
    constrains = True  # llguidance masks: tools and JSON schemas

    def load(self, path: Path, n_ctx: int, options: LoadOptions | None = None) -> LlamaModel:
        try:
            return LlamaModel(path, n_ctx, options)
        except (ValueError, RuntimeError, OSError) as exc:  # its words (paths) to the log
            log.warning("llama.cpp could not load %s: %s", path.name, exc)
            raise EngineError("model_load_failed", "llama.cpp could not load the model.") from exc

    def tokenizer(
        self, path: Path, n_ctx: int, options: LoadOptions | None = None
    ) -> LlamaTokenizer:
        return LlamaTokenizer(path, n_ctx, options=options)

    def context_length(self, path: Path, n_ctx: int, options: LoadOptions | None = None) -> int:
        from lmsp.gguf import read_header

        return _context_of(read_header(path), n_ctx, options or LoadOptions())
