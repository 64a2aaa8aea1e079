"""What an engine kind is: the class that loads a model in an engine process (a
:class:`~lmsp.engines.core.Backend` the core steps, or a
:class:`~lmsp.engines.base.Serving` that serves the channel itself) and gives the API
process its tokenizer. llama.cpp's (:mod:`lmsp.engines.llama_cpp`), the deterministic
engine (:mod:`lmsp.engines.deterministic`) and a remote upstream
(:mod:`lmsp.engines.remote`) are three; :mod:`lmsp.engines.host` picks one per model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from lmsp.engines.base import LoadOptions, Serving, Tokenizer
from lmsp.engines.core import Backend


class Engine(Protocol):
    """An engine kind (llama.cpp, the test engine). It must pickle (a plain class): an
    engine process receives it and calls :meth:`load` there."""

    name: str
    constrains: bool  # holds output to a grammar (tools, JSON schemas)

    def load(self, path: Path, n_ctx: int, options: LoadOptions | None = None) -> Backend | Serving:
        """Load the model, in the engine process. ``n_ctx``: one sequence's context;
        ``options``: how many sequences run together and where saved prefixes live."""
        ...

    def tokenizer(self, path: Path, n_ctx: int, options: LoadOptions | None = None) -> Tokenizer:
        """The prompt formatter of the API process; its ``n_ctx`` is the context an
        engine loaded with the same ``options`` has (``0``: the model's own)."""
        ...

    def context_length(self, path: Path, n_ctx: int, options: LoadOptions | None = None) -> int:
        """One sequence's context an engine loaded with these ``options`` has, read off
        the file's header without loading it (what ``GET /v1/models`` shows)."""
        ...
