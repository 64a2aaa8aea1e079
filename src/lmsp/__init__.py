"""lmsp — a local model service for AI agents whose work is durable."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
PROTOCOL = "lmsp/1.0"

if TYPE_CHECKING:
    from lmsp.client import APIError, AsyncClient, Client, ClientError, UnreachableError

__all__ = [
    "PROTOCOL",
    "APIError",
    "AsyncClient",
    "Client",
    "ClientError",
    "UnreachableError",
    "__version__",
]


def __getattr__(name: str) -> Any:
    """The client's names, imported when first asked for: an engine process (which
    imports this package) never loads the HTTP client."""
    if name in __all__:
        from lmsp import client

        return getattr(client, name)
    raise AttributeError(f"module 'lmsp' has no attribute {name!r}")
