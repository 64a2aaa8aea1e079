"""Embeddings with llama.cpp: a second context of the loaded model, in embedding mode.

It is created the first time an embedding is asked for (a service that only generates
never pays its memory), shares the weights of the generation context and nothing else:
its own KV cache, batch and outputs, so embedding never touches a generating sequence.

Pooling is the model's (``<arch>.pooling_type`` in its GGUF: mean, CLS or last token).
A generative model has none; lmsp pools it by its last token, as causal embedding
models (e5-mistral, Qwen3-Embedding) are pooled and as vLLM pools a decoder model served
for embeddings; llama-server needs ``--pooling last`` to give the same vectors. A
reranker (``rank`` pooling) gives scores, not vectors, and an encoder-decoder model
needs an encode pass lmsp does not run: both are refused (``model_cannot_embed``).
Vectors are L2-normalised, as llama-server's ``/v1/embeddings`` returns them
(``embd_normalize`` 2).

Every input lies whole in one micro-batch (the context's batch and micro-batch are
``n_ctx`` tokens), so its pooling sees all of it; several short inputs share one batch
as sequences of their own, and the cache is cleared after each batch.

The engine asks for small pieces of work instead (``max_tokens``, 64 tokens), so that a
generating sequence never waits long for an embedding: a model pooled by its last token
attends causally, so an input can be
evaluated a chunk at a time, its cache kept between chunks, and its vector read after
the last one — one 512-token decode (tens of times a generation step) becomes short ones
that take turns with the steps, and a sequence arriving waits for one short decode at
most. Short inputs still share a decode, up to ``max_tokens`` in all. A long input's
vector then differs from a one-decode evaluation by rounding only (cosine 0.9999 on
SmolLM2), and is always the same (the chunks do not depend on what else runs). Other
poolings see a whole input at once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lmsp.engines.base import EngineError

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

#: the most inputs one batch embeds together (its sequences)
MAX_SEQUENCES = 64

#: llama.cpp's pooling types, by the value ``<arch>.pooling_type`` holds
POOLING_NAMES = {0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"}


def pooling_of(model_pooling: int | None, has_encoder: bool, has_decoder: bool) -> int:
    """The pooling lmsp embeds a model with (see the module docstring), or
    :class:`EngineError` ``model_cannot_embed``."""
    import llama_cpp

    if has_encoder and has_decoder:
        raise EngineError(
            "model_cannot_embed",
            "This model is an encoder-decoder model; lmsp cannot embed with it. Use an "
            "embedding model or a decoder model.",
        )
    if model_pooling == llama_cpp.LLAMA_POOLING_TYPE_RANK:
        raise EngineError(
            "model_cannot_embed",
            "This model is a reranker (its pooling is 'rank'): it scores pairs of texts and"
            " gives no embeddings.",
        )
    if model_pooling in (
        llama_cpp.LLAMA_POOLING_TYPE_MEAN,
        llama_cpp.LLAMA_POOLING_TYPE_CLS,
        llama_cpp.LLAMA_POOLING_TYPE_LAST,
    ):
        return int(model_pooling)
    return int(llama_cpp.LLAMA_POOLING_TYPE_LAST)  # a generative model: no pooling of its own


def normalized(vectors: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """Each row divided by its Euclidean norm (a zero row stays zero), as llama.cpp's
    ``common_embd_normalize(…, 2)``."""
    import numpy as np

    norms = np.sqrt(np.sum(vectors.astype(np.float64) ** 2, axis=1, keepdims=True))
    scale = np.divide(1.0, norms, out=np.zeros_like(norms), where=norms > 0)
    out: npt.NDArray[np.float32] = (vectors * scale).astype(np.float32)
    return out


class LlamaEmbedder:
    """An embedding context of ``model`` (a ``llama_model`` pointer it does not own)."""

    def __init__(self, model: Any, n_ctx: int, threads: int) -> None:
        import llama_cpp

        self._lib = llama_cpp
        self.pooling = pooling_of(
            _model_pooling(model),
            bool(llama_cpp.llama_model_has_encoder(model)),
            bool(llama_cpp.llama_model_has_decoder(model)),
        )
        self.n_ctx = n_ctx
        self.n_embd = int(llama_cpp.llama_model_n_embd_out(model))
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_batch = n_ctx
        params.n_ubatch = n_ctx
        params.n_seq_max = MAX_SEQUENCES
        params.n_threads = threads
        params.n_threads_batch = threads
        params.kv_unified = True  # the batch's sequences share the cells
        params.embeddings = True
        params.pooling_type = self.pooling
        params.flash_attn_type = 1  # as the generation context
        self.ctx: Any = llama_cpp.llama_init_from_model(model, params)
        if not self.ctx:
            raise EngineError("engine_error", "llama.cpp could not create an embedding context.")
        self.memory = llama_cpp.llama_get_memory(self.ctx)
        self.batch = llama_cpp.llama_batch_init(n_ctx, 0, 1)
        self._partial: list[int] | None = None  # the input evaluated in part, in the cache
        self._done = 0  # its tokens in the cache

    def embed(
        self, inputs: list[list[int]], max_tokens: int | None = None
    ) -> npt.NDArray[np.float32]:
        """The normalised vectors of as many of ``inputs`` as one batch holds (at least
        the first); an input longer than the context is refused. ``max_tokens``: evaluate
        at most that many tokens of the first input (a model pooled by its last token
        only), giving no row until its last chunk."""
        first = inputs[0]
        if self._partial is not None and self._partial is not first:
            self._forget()  # that request was cancelled
        if self._partial is not None:
            return self._chunk(first, max_tokens)
        cap = self.n_ctx
        if max_tokens is not None and self.pooling == self._lib.LLAMA_POOLING_TYPE_LAST:
            cap = max(1, min(cap, max_tokens))
        if len(first) > cap:
            return self._chunk(first, cap)
        return self._whole(inputs, cap)

    def _forget(self) -> None:
        self._partial, self._done = None, 0
        self._lib.llama_memory_clear(self.memory, True)

    def _chunk(self, tokens: list[int], max_tokens: int | None) -> npt.NDArray[np.float32]:
        """The next chunk of one input; its row once the chunk was its last."""
        import numpy as np

        lib, batch = self._lib, self.batch
        if not tokens or len(tokens) > self.n_ctx:
            raise EngineError(
                "context_length_exceeded",
                f"An input has {len(tokens)} tokens; embeddings take 1 to {self.n_ctx}.",
            )
        start = self._done if self._partial is tokens else 0
        left = len(tokens) - start
        n = left if max_tokens is None else max(1, min(max_tokens, left))
        for i in range(n):
            batch.token[i] = tokens[start + i]
            batch.pos[i] = start + i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = True
        batch.n_tokens = n
        try:
            code = int(lib.llama_decode(self.ctx, batch))
            if code != 0:
                raise EngineError("engine_error", f"llama.cpp could not embed (code {code}).")
            if start + n < len(tokens):
                self._partial, self._done = tokens, start + n
                return np.empty((0, self.n_embd), dtype=np.float32)
            pointer = lib.llama_get_embeddings_seq(self.ctx, 0)
            if not pointer:
                raise EngineError("engine_error", "llama.cpp gave no embedding.")
            row = np.ctypeslib.as_array(pointer, shape=(self.n_embd,)).reshape(1, -1).copy()
        except BaseException:
            self._forget()
            raise
        self._forget()
        return normalized(row)

    def _whole(self, inputs: list[list[int]], cap: int) -> npt.NDArray[np.float32]:
        """Whole inputs, as many as ``cap`` tokens hold (at least the first)."""
        import numpy as np

        lib, batch = self._lib, self.batch
        n = 0
        taken = 0
        for tokens in inputs[:MAX_SEQUENCES]:
            if not tokens or len(tokens) > self.n_ctx:
                raise EngineError(
                    "context_length_exceeded",
                    f"An input has {len(tokens)} tokens; embeddings take 1 to {self.n_ctx}.",
                )
            if n + len(tokens) > (cap if taken else self.n_ctx):
                break
            for pos, token in enumerate(tokens):
                batch.token[n] = token
                batch.pos[n] = pos
                batch.n_seq_id[n] = 1
                batch.seq_id[n][0] = taken
                batch.logits[n] = True  # an embedding context outputs every token
                n += 1
            taken += 1
        batch.n_tokens = n
        try:
            code = int(lib.llama_decode(self.ctx, batch))
            if code != 0:
                raise EngineError("engine_error", f"llama.cpp could not embed (code {code}).")
            rows = np.empty((taken, self.n_embd), dtype=np.float32)
            for seq in range(taken):
                pointer = lib.llama_get_embeddings_seq(self.ctx, seq)
                if not pointer:
                    raise EngineError("engine_error", "llama.cpp gave no embedding.")
                rows[seq] = np.ctypeslib.as_array(pointer, shape=(self.n_embd,))
        finally:
            lib.llama_memory_clear(self.memory, True)
        return normalized(rows)

    def close(self) -> None:
        if self.ctx:
            self._lib.llama_batch_free(self.batch)
            self._lib.llama_free(self.ctx)
            self.ctx = None


def _model_pooling(model: Any) -> int | None:
    """``<arch>.pooling_type`` from the model's metadata, ``None`` when absent."""
    arch = _meta(model, "general.architecture")
    value = _meta(model, f"{arch}.pooling_type") if arch else None
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _meta(model: Any, key: str) -> str | None:
    import ctypes

    import llama_cpp

    buffer = ctypes.create_string_buffer(256)
    size = int(llama_cpp.llama_model_meta_val_str(model, key.encode(), buffer, len(buffer)))
    if size < 0:
        return None
    return buffer.value.decode("utf-8", errors="replace")
