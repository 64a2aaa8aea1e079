"""One llama.cpp context with several sequences, through llama-cpp-python's public
low-level bindings (``llama_cpp.llama_*``): the weights, a KV cache with one stream per
sequence (``kv_unified`` off: a sequence's attention covers its own cells only, which
is both the fastest layout measured here and what keeps a sequence's arithmetic
independent of what the others hold), a batch buffer, and the sequence operations the
engine needs — trim, and save or restore a sequence's cache as bytes.

How the context is laid out is a :class:`Layout`: :data:`FAST` (the default) or
:data:`EXACT` (``LMSP_EXACT=1``); docs/performance.md has the measurements behind them.

The model is loaded with llama.cpp's extra buffer types off (``use_extra_bufts``): on
CPUs with AMX their matrix kernel crashes in some environments, and the plain CPU
kernels are the ones whose results the batching relies on.
"""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmsp.engines.base import EngineError
from lmsp.engines.batch import Request
from lmsp.engines.prefault import populated

if TYPE_CHECKING:
    pass


@dataclass(frozen=True)
class Layout:
    """How a context is laid out: the micro-batch (``n_batch`` = ``n_ubatch``, the most
    tokens one step evaluates), flash attention (llama.cpp's ``flash_attn_type``: -1
    auto, 0 off, 1 on), one KV stream per sequence or a unified cache, and whether a lone
    sequence gets a spare stream beside it (exact mode's fillers need one)."""

    ubatch: int = 512
    flash_attn: int = 1
    unified: bool = False
    spare_stream: bool = False


#: the default: prompts in full 512-token micro-batches, flash attention on, one KV
#: stream per sequence (docs/performance.md: the fastest of the layouts measured here)
FAST = Layout()
#: ``LMSP_EXACT=1``: the layout the bit-for-bit guarantee was measured on
EXACT = Layout(ubatch=512, flash_attn=1, unified=False, spare_stream=True)


def yarn_factor(n_ctx: int, trained: int) -> int:
    """How far YaRN stretches a model's positions for a context of ``n_ctx``: the power
    of two that covers ``n_ctx / trained``. Measured on SmolLM2-135M (trained on 8,192):
    x2 copies a text back exactly from 9.4k and 12k tokens in, and x4 from 300, 2k and
    Claude Code's 21k; the exact ratio x1.19 (a 9,728-token context) gave noise at 9.4k
    where x2 did not."""
    return 1 << max(1, math.ceil(math.log2(n_ctx / trained)))


def load_model(path: Path) -> Any:
    """The model file's weights and vocabulary, loaded by llama.cpp (a ``llama_model``
    pointer, for one :class:`LlamaContext`)."""
    import llama_cpp

    llama_cpp.llama_backend_init()  # what llama-cpp-python's ``Llama`` calls first
    params = llama_cpp.llama_model_default_params()
    params.use_extra_bufts = False
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
    if not model:
        raise EngineError("model_load_failed", f"llama.cpp could not load {path.name}.")
    return model


class LlamaContext:
    """``sequences`` sequences, each with a KV stream of its own, plus a spare stream
    when there is only one (see :meth:`LlamaModel.decode
    <lmsp.engines.llama_cpp.LlamaModel.decode>`: a lone sequence's single token is
    decoded beside a filler token of a neighbouring stream)."""

    def __init__(
        self,
        model: Any,
        n_ctx: int,
        sequences: int,
        threads: int,
        layout: Layout = EXACT,
        *,
        yarn_from: int = 0,
    ) -> None:
        """``model``: a model :func:`load_model` loaded, this context's from now on (freed
        with it, or at once if the context cannot be created). ``yarn_from``: the trained
        context YaRN rope scaling stretches by :func:`yarn_factor`
        (:func:`lmsp.engines.llama_cpp.yarn_base`; 0: none)."""
        import llama_cpp

        self._lib = llama_cpp
        self.model = model
        self.vocab = llama_cpp.llama_model_get_vocab(self.model)
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(self.vocab))
        if n_ctx <= 0:
            n_ctx = int(llama_cpp.llama_model_n_ctx_train(self.model))
        self.sequences = max(1, sequences)
        spare = layout.spare_stream and self.sequences == 1
        self.streams = self.sequences + 1 if spare else self.sequences
        self.max_tokens = layout.ubatch
        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx = n_ctx * self.streams
        cparams.n_batch = self.max_tokens
        cparams.n_ubatch = self.max_tokens
        cparams.n_seq_max = self.streams
        cparams.n_threads = threads
        cparams.n_threads_batch = threads
        cparams.kv_unified = layout.unified
        cparams.flash_attn_type = layout.flash_attn
        if yarn_from and n_ctx > yarn_from:
            cparams.rope_scaling_type = llama_cpp.LLAMA_ROPE_SCALING_TYPE_YARN
            cparams.yarn_orig_ctx = yarn_from
            cparams.rope_freq_scale = 1 / yarn_factor(n_ctx, yarn_from)
        self.kv_bytes_per_token = self._kv_bytes_per_token()
        with populated(self.kv_bytes_per_token * cparams.n_ctx):
            self.ctx: Any = llama_cpp.llama_init_from_model(self.model, cparams)
        if not self.ctx:
            llama_cpp.llama_model_free(self.model)
            raise EngineError("model_load_failed", "llama.cpp could not create a context.")
        self.n_ctx = int(llama_cpp.llama_n_ctx_seq(self.ctx))  # one sequence's room
        self.memory = llama_cpp.llama_get_memory(self.ctx)
        self.batch = llama_cpp.llama_batch_init(self.max_tokens, 0, 1)

    def _kv_bytes_per_token(self) -> int:
        lib, model = self._lib, self.model
        layers = int(lib.llama_model_n_layer(model))
        width = int(lib.llama_model_n_embd(model))
        heads = max(1, int(lib.llama_model_n_head(model)))
        kv_width = width * int(lib.llama_model_n_head_kv(model)) // heads
        return 2 * layers * kv_width * 2  # K and V, 16-bit

    def memory_bytes(self) -> int:
        """The weights plus the KV cache of every sequence."""
        weights = int(self._lib.llama_model_size(self.model))
        return weights + self.kv_bytes_per_token * self.n_ctx * self.streams

    # -- one step ----------------------------------------------------------------------
    def decode(self, step: list[Request]) -> None:
        """Evaluate every request's tokens in one ``llama_decode``; give each request
        that asked for them its last token's logits.

        Call it from one thread only, the engine's loop: llama.cpp's CPU backend keeps a
        team of worker threads per calling thread; steps led by changing threads left
        several teams spinning against each other (3x slower), and with two contexts
        stepped from two threads of one process a test saw a sequence's results change
        in the last bits. An engine process holds one context, stepped by its loop.

        The requests go in by sequence id: llama.cpp splits a batch of several KV
        streams into micro-batches of consecutive, increasing sequence ids, one forward
        pass each, so in any other order one step can cost several passes (and a lone
        sequence's attention takes another kernel, see ``LlamaModel.decode``)."""
        import numpy as np

        batch = self.batch
        n = 0
        wanted: list[tuple[Request, int]] = []
        for request in sorted(step, key=lambda r: r.seq):
            last = len(request.tokens) - 1
            for i, token in enumerate(request.tokens):
                batch.token[n] = token
                batch.pos[n] = request.pos + i
                batch.n_seq_id[n] = 1
                batch.seq_id[n][0] = request.seq
                out = request.logits and i == last
                batch.logits[n] = out
                if out:
                    wanted.append((request, n))
                n += 1
        batch.n_tokens = n
        code = int(self._lib.llama_decode(self.ctx, batch))
        if code != 0:
            raise EngineError("engine_error", f"llama.cpp could not decode (code {code}).")
        for request, index in wanted:
            pointer = self._lib.llama_get_logits_ith(self.ctx, index)
            request.result = np.ctypeslib.as_array(pointer, shape=(self.n_vocab,)).copy()

    # -- sequences (call with no step running) --------------------------------------------
    def trim(self, seq: int, keep: int) -> None:
        """Forget what ``seq`` holds from position ``keep`` on."""
        self._lib.llama_memory_seq_rm(self.memory, seq, keep, -1)

    def save(self, seq: int) -> bytes:
        """The cache of ``seq`` as bytes (``llama_state_seq_get_data``)."""
        size = int(self._lib.llama_state_seq_get_size(self.ctx, seq))
        buffer = (ctypes.c_uint8 * size)()
        written = int(self._lib.llama_state_seq_get_data(self.ctx, buffer, size, seq))
        return ctypes.string_at(buffer, written)  # one copy (slicing makes a list of ints)

    def restore(self, seq: int, data: bytes) -> bool:
        """Load saved bytes into ``seq``; ``False`` (``seq`` left empty) if refused."""
        self._lib.llama_memory_seq_rm(self.memory, seq, -1, -1)
        buffer = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        read = int(self._lib.llama_state_seq_set_data(self.ctx, buffer, len(data), seq))
        if read == 0:
            self._lib.llama_memory_seq_rm(self.memory, seq, -1, -1)
            return False
        return True

    def positions(self, seq: int) -> int:
        """How many positions ``seq`` holds (its highest plus one)."""
        return int(self._lib.llama_memory_seq_pos_max(self.memory, seq)) + 1

    def close(self) -> None:
        if self.ctx:
            self._lib.llama_batch_free(self.batch)
            self._lib.llama_free(self.ctx)
            self._lib.llama_model_free(self.model)
            self.ctx = None
