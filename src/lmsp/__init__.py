"""lmsp — a local model service for AI agents whose work is durable."""

from __future__ import annotations

__version__ = "0.1.0"
PROTOCOL = "lmsp/1.0"

from lmsp.client import APIError, AsyncClient, Client, ClientError, UnreachableError  # noqa: E402

__all__ = [
    "PROTOCOL",
    "APIError",
    "AsyncClient",
    "Client",
    "ClientError",
    "UnreachableError",
    "__version__",
]
