"""Service configuration: each setting declared once, read from the environment in one loop.

A setting's declaration (:func:`setting`, on its :class:`Settings` field) holds its
environment variable, its type (a :class:`Kind`: one parser a type, e.g.
:func:`parse_duration` for every duration), its default as it is written in the
environment, its bounds and the help the README's settings table shows (a test checks
that table against these declarations). :func:`from_env` reads every declared variable
that is set (and not empty); a bad value raises ``ValueError`` naming the variable.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Callable, Mapping
from dataclasses import Field, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Generic, TypeVar, cast

T = TypeVar("T")

ON_RESTART_POLICIES = ("fail", "retry", "resume")

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, None: 1}


def parse_duration(text: str) -> float:
    """Parse ``30s``, ``12h``, ``7d``, ``250ms`` or a bare number of seconds."""
    match = _DURATION.match(text)
    if not match:
        raise ValueError(f"invalid duration {text!r} (use e.g. 30s, 15m, 12h, 7d)")
    return float(match.group(1)) * _UNIT_SECONDS[match.group(2)]


def _flag(value: str) -> bool:
    return value.strip().lower() in {"1", "true", "yes", "on"}


def _names(value: str) -> tuple[str, ...]:
    """A comma-separated list (``LMSP_ALLOWED_HOSTS``, ``LMSP_TRUSTED_PROXIES``)."""
    return tuple(name.strip() for name in value.split(",") if name.strip())


LIMIT_NAMES = ("max_queued", "max_running", "tokens_per_minute", "tokens_per_day")


def parse_limits(text: str) -> tuple[tuple[str, int], ...]:
    """``max_queued=10,tokens_per_day=200000`` (LMSP_DEFAULT_LIMITS): each a known limit
    and a whole number of at least 1."""
    found: dict[str, int] = {}
    for part in _names(text):
        name, _, value = part.partition("=")
        name = name.strip()
        if name not in LIMIT_NAMES:
            known = ", ".join(LIMIT_NAMES)
            raise ValueError(f"LMSP_DEFAULT_LIMITS: unknown limit {name!r} ({known})")
        if not value.strip().isdigit() or int(value) < 1:
            raise ValueError(f"LMSP_DEFAULT_LIMITS: {name} must be a whole number of at least 1")
        found[name] = int(value)
    return tuple(found.items())


def _vet_hosts(value: str, env: str) -> None:
    """``host[:port]`` entries, comma-separated, ``*`` any: a malformed entry stops the
    start, saying which."""
    from lmsp.protocol.outbound import parse_hosts

    parse_hosts(value, env)


@dataclass(frozen=True)
class Kind(Generic[T]):
    """How one type of setting is read from its text: one parser a type. ``vet``, if
    any, checks the text first (with the variable's name, for its message)."""

    parse: Callable[[str], T]
    vet: Callable[[str, str], None] | None = None


TEXT = Kind(str)
SECRET = Kind(str.strip)
PATH = Kind(lambda v: Path(v).expanduser())
INT = Kind(int)
FLOAT = Kind(float)
DURATION = Kind(parse_duration)
FLAG = Kind(_flag)
NAMES = Kind(_names)
LIMITS = Kind(parse_limits)
URL = Kind(lambda v: v.rstrip("/"))
HOSTS = Kind(_names, _vet_hosts)
HOSTS_TEXT = Kind(str, _vet_hosts)  # kept as written (lmsp.protocol.webhooks reads it)
ROPE = Kind(lambda v: v == "yarn")  # ``yarn`` (stretch) or ``none``

#: the key of a :class:`Settings` field's metadata that holds its declaration
DECLARATION = "lmsp.setting"
#: the bound of the quotas, where 0 is none
NO_LIMIT = "0 (no limit) or more"


@dataclass(frozen=True)
class Setting(Generic[T]):
    """One setting as declared: its variable, type, default and bounds as written in
    the environment, and the README's words for it.

    ``least``/``most`` (inclusive) and ``above`` (exclusive) are bounds in the
    variable's own syntax (``1s``, ``1024``); ``one_of`` the only texts it may be,
    ``prefixes`` what it must start with. ``says`` is the bound as the error states it
    where the plain wording (``at least 1``, ``more than 0s``, ``between 5ms and 1s``,
    ``text or json``) is not it. ``shown`` is the README's default where the default
    is computed or not ``default`` itself; ``documented=False`` keeps a setting out of
    the README's table (the test suite's switch, a secret).
    """

    env: str
    kind: Kind[T]
    default: str | None
    help: str
    shown: str | None = None
    flag: str = ""
    least: str | None = None
    most: str | None = None
    above: str | None = None
    one_of: tuple[str, ...] = ()
    prefixes: tuple[str, ...] = ()
    says: str = ""
    documented: bool = True

    def read(self, text: str) -> T:
        """The value of ``text``, or ``ValueError`` saying what the variable must be."""
        if (self.one_of and text not in self.one_of) or not text.startswith(self.prefixes or ""):
            raise ValueError(f"{self.env} must be {self.bound()}")
        if self.kind.vet is not None:
            self.kind.vet(text, self.env)
        value = self.kind.parse(text)
        low = None if self.least is None else self.kind.parse(self.least)
        high = None if self.most is None else self.kind.parse(self.most)
        floor = None if self.above is None else self.kind.parse(self.above)
        if (
            (low is not None and value < low)  # type: ignore[operator]
            or (high is not None and value > high)  # type: ignore[operator]
            or (floor is not None and value <= floor)  # type: ignore[operator]
        ):
            raise ValueError(f"{self.env} must be {self.bound()}")
        return value

    def bound(self) -> str:
        """What the value must be, as an error says it."""
        if self.says:
            return self.says
        if self.one_of:
            return " or ".join([", ".join(self.one_of[:-1]), self.one_of[-1]])
        if self.least is not None and self.most is not None:
            return f"between {self.least} and {self.most}"
        if self.above is not None:
            return f"more than {self.above}"
        return "0 or more" if self.least == "0" else f"at least {self.least}"

    def value(self) -> T | None:
        """The default value (None: computed, or unset)."""
        return None if self.default is None else self.kind.parse(self.default)

    def default_text(self) -> str:
        """The default as the README's table shows it."""
        if self.shown is not None:
            return self.shown
        return f"`{self.default}`" if self.default else ""

    def row(self) -> str:
        """This setting's row of the README's settings table."""
        flag = f"`{self.flag}`" if self.flag else ""
        cells = [f"`{self.env}`", flag, self.default_text(), self.help]
        return "|" + "|".join(f" {cell} " if cell else " " for cell in cells) + "|"

    def option_help(self, what: str) -> str:
        """A command-line option's help: ``what`` and where else its value comes from."""
        return f"{what} ({self.env}; default {self.default_text().strip('`')})."


def setting(
    env: str,
    kind: Kind[T],
    default: str | None,
    help: str,
    *,
    factory: Callable[[], T] | None = None,
    repr: bool = True,
    **declared: Any,
) -> T:
    """A :class:`Settings` field declared by its variable (see :class:`Setting`); its
    value is ``default`` read as the variable would be, else ``factory()``, else None."""
    decl = Setting(env, kind, default, help, **declared)
    meta = {DECLARATION: decl}
    if factory is not None:
        return field(default_factory=factory, metadata=meta, repr=repr)
    return cast(T, field(default=decl.value(), metadata=meta, repr=repr))


def default_kv_budget() -> int:
    """A quarter of the machine's physical memory (1 GiB where it cannot be read)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 4
    except (ValueError, OSError, AttributeError):
        return 1 << 30


def default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "lmsp"


@dataclass(frozen=True)
class Settings:
    """Every setting of the service: each field declared by its variable (:func:`setting`).

    One setting a few lines: the formatter would give each argument a line of its own.
    """

    # fmt: off
    data_dir: Path = setting(
        "LMSP_DATA_DIR", PATH, None,
        "database, model blobs, prefix cache, `owner.token`",
        factory=default_data_dir, shown="`~/.local/share/lmsp`", flag="--data-dir")
    host: str = setting("LMSP_HOST", TEXT, "127.0.0.1", "address to bind", flag="--host")
    port: int = setting("LMSP_PORT", INT, "8430", "port", flag="--port")
    retention: float = setting(
        "LMSP_RETENTION", DURATION, "7d",
        "keep finished tasks this long (`30s`, `12h`, `7d`)")
    conversation_retention: float = setting(
        "LMSP_CONVERSATION_RETENTION", DURATION, "0",
        "delete conversations unused this long (`30d`); `0`: never, as PROTOCOL.md 10 says")
    default_on_restart: str = setting(
        "LMSP_DEFAULT_ON_RESTART", TEXT, "fail",
        "policy for requests that do not name one",
        one_of=ON_RESTART_POLICIES, says=f"one of {ON_RESTART_POLICIES}")
    # 4: the best of 1, 2, 4, 8 (docs/performance.md)
    parallel: int = setting(
        "LMSP_PARALLEL", INT, "4",
        "sequences decoded together in one context (tasks generated at once)",
        least="1")
    reserved_sequences: int = setting(
        "LMSP_RESERVED_SEQUENCES", INT, "1",
        "sequences more, taken only by a client with nothing running while the others are busy, "
        "so its first request starts at once (0: none; docs/fair-share.md)",
        least="0", most="8", says="from 0 to 8")
    max_body_bytes: int = setting(
        "LMSP_MAX_BODY_BYTES", INT, "1048576",
        "request body limit (`413` above)")
    max_queue: int = setting("LMSP_MAX_QUEUE", INT, "1024", "queued tasks before `429`")
    idempotency_ttl: float = setting(
        "LMSP_IDEMPOTENCY_TTL", DURATION, "24h",
        "how long an `Idempotency-Key` is remembered")
    gc_interval: float = setting(
        "LMSP_GC_INTERVAL", DURATION, "1m",
        "how often a running server deletes what retention and the prefix cache's limits let go")
    flush_interval: float = setting(
        "LMSP_FLUSH_INTERVAL", DURATION, "100ms",
        "how often a generating task logs its new text (5ms to 1s): its first text goes at once, "
        "then one delta event per interval carries every token since; shorter means finer "
        "streaming and more CPU a token",
        least="5ms", most="1s")
    n_ctx: int = setting(
        "LMSP_N_CTX", INT, "0",
        "one sequence's context; `0`: the model's trained context (SmolLM2: 8,192), cut to fit "
        "`LMSP_KV_BUDGET`",
        least="0", says="0 (the model's own) or more")
    kv_budget: int = setting(
        "LMSP_KV_BUDGET", INT, None,
        "bytes one model's KV caches (every sequence's) may take; the context is cut to fit "
        "(docs/operations.md)",
        factory=default_kv_budget, shown="a quarter of the memory", least="1048576",
        says="at least 1048576 bytes")
    exact: bool = setting(
        "LMSP_EXACT", FLAG, "0",
        "`1`: batched = solo and resumed = uninterrupted, bit for bit, at a cost "
        "(docs/performance.md); `0`: llama-server's fast schedule")
    rope_scaling: bool = setting(
        "LMSP_ROPE_SCALING", ROPE, "yarn",
        "a context past the model's trained one stretches its positions with YaRN (by the power "
        "of two that covers it), unless the model declares its own scaling; `none`: no stretch "
        "(positions it never saw: noise)",
        one_of=("yarn", "none"))
    keep_alive: float = setting("LMSP_KEEP_ALIVE", DURATION, "5m", "unload a model idle this long")
    max_loaded_models: int = setting(
        "LMSP_MAX_LOADED_MODELS", INT, "1",
        "distinct models in memory at once (each in an engine process of its own)",
        least="1")
    enable_test_engine: bool = setting(
        "LMSP_ENABLE_TEST_ENGINE", FLAG, "0",
        "the deterministic engine (lmsp.engines.deterministic), for the test suite",
        documented=False)
    sse_ping: float = setting(
        "LMSP_SSE_PING", DURATION, "15s",
        "keep-alive comment line on idle event streams")
    cancel_wait: float = setting(
        "LMSP_CANCEL_WAIT", DURATION, "5s",
        "how long a cancel waits for the runner to stop before answering")
    pairing_ttl: float = setting(
        "LMSP_PAIRING_TTL", DURATION, "10m",
        "how long a pairing request waits for approval",
        least="1s")
    max_pending_pairings: int = setting(
        "LMSP_MAX_PENDING_PAIRINGS", INT, "64",
        "pairing requests waiting at once, all sources, before `429`",
        least="1")
    max_pending_pairings_per_source: int = setting(
        "LMSP_MAX_PENDING_PAIRINGS_PER_SOURCE", INT, "4",
        "pairing requests one address beyond this machine may have waiting before `429`",
        least="1")
    max_pending_pairings_per_name: int = setting(
        "LMSP_MAX_PENDING_PAIRINGS_PER_NAME", INT, "4",
        "pairing requests with one client name waiting before `429`",
        least="1")
    header_timeout: float = setting(
        "LMSP_HEADER_TIMEOUT", DURATION, "10s",
        "a request's headers must arrive within this (else `408`, closed)",
        above="0s")
    body_timeout: float = setting(
        "LMSP_BODY_TIMEOUT", DURATION, "30s",
        "a request's body must arrive within this after its headers",
        above="0s")
    http_idle_timeout: float = setting(
        "LMSP_HTTP_IDLE_TIMEOUT", DURATION, "75s",
        "an idle kept-alive connection is closed after this (longer than clients keep theirs)",
        above="0s")
    max_connections: int = setting(
        "LMSP_MAX_CONNECTIONS", INT, "1000",
        "open connections; past it idle ones are dropped, then `503`",
        least="1")
    max_header_bytes: int = setting(
        "LMSP_MAX_HEADER_BYTES", INT, "65536",
        "a request's line and headers in all (`431` above)",
        least="1024")
    max_headers: int = setting(
        "LMSP_MAX_HEADERS", INT, "100",
        "header fields in one request (`431` above)",
        least="8")
    ws_idle_timeout: float = setting(
        "LMSP_WS_IDLE_TIMEOUT", DURATION, "10m",
        "a WebSocket with no turn running and no frame for this long is closed",
        above="0s")
    ws_max_age: float = setting(
        "LMSP_WS_MAX_AGE", DURATION, "60m",
        "a WebSocket is closed after this long (`websocket_connection_limit_reached`)",
        above="0s")
    ws_per_client: int = setting(
        "LMSP_WS_PER_CLIENT", INT, "32",
        "WebSockets one client may hold open (`429 too_many_websockets` past it)",
        least="1")
    ws_send_timeout: float = setting(
        "LMSP_WS_SEND_TIMEOUT", DURATION, "60s",
        "a WebSocket that takes no event for this long is closed (a stored turn runs on)",
        above="0s")
    ws_cache_bytes: int = setting(
        "LMSP_WS_CACHE_BYTES", INT, "8388608",
        "a WebSocket's `store: false` responses kept for continuation (oldest out)",
        least="0")
    allowed_hosts: tuple[str, ...] = setting(
        "LMSP_ALLOWED_HOSTS", NAMES, "",
        "`Host` names answered besides the bound address and `localhost` (others get `421`)")
    trusted_proxies: tuple[str, ...] = setting(
        "LMSP_TRUSTED_PROXIES", NAMES, "",
        "peers whose `X-Forwarded-For`/`-Proto` is believed (none by default)")
    http: str = setting(
        "LMSP_HTTP", TEXT, "auto",
        "HTTP parser: `httptools` (the default when installed) or `h11`",
        one_of=("auto", "httptools", "h11"))
    log_format: str = setting(
        "LMSP_LOG_FORMAT", TEXT, "text",
        "`json`: one JSON object a log line (time, level, event, ids)",
        one_of=("text", "json"))
    kv_cache_bytes: int = setting(
        "LMSP_KV_CACHE_BYTES", INT, "2147483648",
        "size of the durable prefix cache (saved KV state of prompt prefixes); `0` turns it off",
        least="0", says="0 (off) or more")
    kv_cache_ttl: float = setting(
        "LMSP_KV_CACHE_TTL", DURATION, "7d",
        "a saved prompt prefix unused this long is deleted",
        above="0s")
    # None: a tenth of the disk, at most 4 GiB
    kv_cache_reserve: int | None = setting(
        "LMSP_KV_CACHE_RESERVE", INT, None,
        "free space the prefix cache never takes",
        shown="a tenth of the disk (≤ 4 GiB)", least="0", says="0 or more bytes")
    input_workers: int = setting(
        "LMSP_INPUT_WORKERS", INT, "2",
        "worker processes that read schemas and PDFs",
        least="1")
    input_memory: int = setting(
        "LMSP_INPUT_MEMORY", INT, "536870912",
        "memory of each worker process that reads schemas and PDFs",
        least="67108864")
    file_cpu_time: float = setting(
        "LMSP_FILE_CPU_TIME", DURATION, "5s",
        "CPU time to read one PDF as text (`400 invalid_file` above)",
        above="0s")
    schema_cpu_time: float = setting(
        "LMSP_SCHEMA_CPU_TIME", DURATION, "2s",
        "CPU time to compile one request's JSON Schemas (`400 schema_too_complex` above)",
        above="0s")
    max_schema_bytes: int = setting(
        "LMSP_MAX_SCHEMA_BYTES", INT, "262144",
        "one request's JSON Schemas, as compact JSON (`400 schema_too_complex` above)",
        least="1")
    engine_restarts: int = setting(
        "LMSP_ENGINE_RESTARTS", INT, "5",
        "a crashed engine is restarted at most this often within the window; the next crash marks"
        " its model failed",
        least="0")
    engine_restart_window: float = setting(
        "LMSP_ENGINE_RESTART_WINDOW", DURATION, "10m",
        "the window those restarts are counted in",
        above="0s")
    engine_orphan_timeout: float = setting(
        "LMSP_ENGINE_ORPHAN_TIMEOUT", DURATION, "0s",
        "how long an engine process outlives a crash of the API process, waiting for the next"
        " `lmsp serve` on this data directory to reattach to it (its model loaded, its cache"
        " warm); 0: it exits with the API process")
    engine_nice: int = setting(
        "LMSP_ENGINE_NICE", INT, "10",
        "how far below the API process's the scheduling priority of a local model's engine"
        " process is (`nice`): its threads give way to the API's, so requests, streams and"
        " `/healthz` are served at once while the model computes; 0: on a par (a machine"
        " shared with other CPU-heavy work)",
        least="0", most="19")
    spare_engine: bool = setting(
        "LMSP_SPARE_ENGINE", FLAG, "0",
        "`1`: each loaded model keeps a second engine process loaded (its KV cache too: twice"
        " the memory) that takes over at once when the serving one crashes")
    embed_max_inputs: int = setting(
        "LMSP_EMBED_MAX_INPUTS", INT, "256",
        "inputs one `POST /v1/embeddings` request may have (`400` above)",
        least="1")
    embed_max_tokens: int = setting(
        "LMSP_EMBED_MAX_TOKENS", INT, "512",
        "tokens one embedding input may have (`400` above); also the size of each engine's "
        "embedding context",
        least="1")
    # engines run on a thread of the API process instead of a process of their own: for
    # fast in-process tests of the deterministic engine only (no variable sets it)
    in_thread_engines: frozenset[str] = frozenset()
    database_url: str | None = setting(
        "LMSP_DATABASE_URL", TEXT, None,
        "`postgresql://…`: keep the state in PostgreSQL, shared by several nodes "
        "([docs/scale-out.md](docs/scale-out.md)); unset, the data directory's SQLite",
        prefixes=("postgresql://", "postgres://"), says="a postgresql:// URL")
    node_id: str | None = setting(
        "LMSP_NODE_ID", TEXT, None,
        "this node's id on a shared database",
        shown="host:port")
    lease_ttl: float = setting(
        "LMSP_LEASE_TTL", DURATION, "15s",
        "how long a node's lease on its tasks lasts without renewal; past it another node takes "
        "them over",
        least="1s")
    # ``(name, value)`` pairs; the owner is never limited
    default_limits: tuple[tuple[str, int], ...] = setting(
        "LMSP_DEFAULT_LIMITS", LIMITS, "",
        "limits every new client gets, e.g. `max_queued=50,tokens_per_day=1000000` "
        "([docs/fair-share.md](docs/fair-share.md))",
        shown="none")
    hf_endpoint: str = setting(
        "LMSP_HF_ENDPOINT", URL, "https://huggingface.co",
        "the model hub `lmsp pull` reads (its file API); `HF_TOKEN` in the service's environment "
        "opens gated repositories ([docs/models.md](docs/models.md))",
        prefixes=("http://", "https://"), says="an http(s):// URL")
    # never shown: not in this object's repr, never logged (LMSP_HF_ENDPOINT's row names it)
    hf_token: str | None = setting(
        "HF_TOKEN", SECRET, None, "the token of the hub's gated repositories",
        documented=False, repr=False)
    webhook_retry: float = setting(
        "LMSP_WEBHOOK_RETRY", DURATION, "5s",
        "the first wait before a refused webhook delivery is tried again (then doubling, at most "
        "1 h) ([docs/webhooks.md](docs/webhooks.md))",
        above="0s")
    webhook_give_up: float = setting(
        "LMSP_WEBHOOK_GIVE_UP", DURATION, "24h",
        "how long after its event a webhook delivery is tried; then it is marked failed",
        above="0s")
    webhook_hosts: str = setting(
        "LMSP_WEBHOOK_HOSTS", HOSTS_TEXT, "",
        "hosts beyond loopback a webhook URL may name: `host[:port]`, comma-separated; `*` any "
        "(link-local only by exact entry)")
    embed_request_tokens: int = setting(
        "LMSP_EMBED_REQUEST_TOKENS", INT, "32768",
        "the most tokens all of one embeddings request's inputs may have (`400 "
        "embedding_budget_exceeded`)",
        least="1")
    embed_share: float = setting(
        "LMSP_EMBED_SHARE", FLOAT, "0.25",
        "the part of an engine's time embedding batches may take while sequences generate",
        least="0.01", most="1")
    request_cpu_time: float = setting(
        "LMSP_REQUEST_CPU_TIME", DURATION, "10s",
        "the CPU time all of one request's schemas and PDFs may take together, counted from its "
        "arrival ([docs/operations.md](docs/operations.md))",
        above="0s")
    max_clock_skew: float = setting(
        "LMSP_MAX_CLOCK_SKEW", DURATION, "30s",
        "past it, `lmsp doctor` fails a node whose clock is off from the shared database's "
        "(everything that ages is judged by the database's clock)",
        above="0s")
    mcp_hosts: tuple[str, ...] = setting(
        "LMSP_MCP_HOSTS", HOSTS, "",
        "hosts besides loopback an MCP tool's `server_url` may name (`host[:port]`, "
        "comma-separated; `*` any, link-local only by exact entry); else `400 invalid_mcp_server`"
        " ([docs/tools.md](docs/tools.md))")
    mcp_timeout: float = setting(
        "LMSP_MCP_TIMEOUT", DURATION, "60s",
        "the time one MCP request (a tool list or call) may take; past it the call's item carries"
        " an error",
        above="0s")
    mcp_max_result: int = setting(
        "LMSP_MCP_MAX_RESULT", INT, "65536",
        "characters of an MCP tool's result kept (the rest is cut, saying so)",
        least="1")
    mcp_max_bytes: int = setting(
        "LMSP_MCP_MAX_BYTES", INT, "1048576",
        "bytes read from an MCP server for one request (its session: the tool list's pages, or "
        "the call), counted as they arrive; past it the request is dropped and fails, saying so "
        "([docs/tools.md](docs/tools.md))",
        least="4096")
    conversation_max_items: int = setting(
        "LMSP_CONVERSATION_MAX_ITEMS", INT, "10000",
        "items one conversation may hold (`409 conversation_quota_exceeded` past it; `0`: no "
        "limit)",
        least="0", says=NO_LIMIT)
    conversation_max_bytes: int = setting(
        "LMSP_CONVERSATION_MAX_BYTES", INT, "33554432",
        "bytes one conversation's stored items may take (`0`: no limit)",
        least="0", says=NO_LIMIT)
    client_conversation_bytes: int = setting(
        "LMSP_CLIENT_CONVERSATION_BYTES", INT, "1073741824",
        "bytes all of one client's conversations may take together (`0`: no limit)",
        least="0", says=NO_LIMIT)
    # fmt: on

    @property
    def node(self) -> str:
        """This node's id: ``LMSP_NODE_ID``, else the machine's name and the port."""
        return self.node_id or f"{socket.gethostname()}:{self.port}"

    @property
    def db_path(self) -> Path:
        return self.data_dir / "lmsp.db"

    @property
    def owner_token_path(self) -> Path:
        return self.data_dir / "owner.token"

    @property
    def blobs_dir(self) -> Path:
        return self.data_dir / "blobs"

    @property
    def kv_dir(self) -> Path:
        """The durable prefix cache (:mod:`lmsp.engines.kvfiles`)."""
        return self.data_dir / "kv"

    def with_overrides(self, **changes: object) -> Settings:
        clean = {k: v for k, v in changes.items() if v is not None}
        return replace(self, **clean)  # type: ignore[arg-type]


#: read by each engine process (which inherits the service's environment), not a field
THREADS: Setting[int] = Setting(
    "LMSP_THREADS",
    INT,
    "0",
    "threads llama.cpp uses to evaluate prompts and generate",
    shown="all CPUs",
)


def engine_threads() -> int:
    """``LMSP_THREADS`` (0 or unset: every CPU), at least 1."""
    text = os.environ.get(THREADS.env)
    return max(1, (THREADS.read(text) if text else 0) or (os.cpu_count() or 1))


def declared(name: str) -> Setting[Any]:
    """The declaration of the :class:`Settings` field ``name``."""
    return cast(Setting[Any], _fields()[name].metadata[DECLARATION])


def declarations() -> list[Setting[Any]]:
    """Every setting read from the environment: the fields', then the engines' own."""
    return [f.metadata[DECLARATION] for f in _fields().values() if DECLARATION in f.metadata] + [
        THREADS
    ]


def _fields() -> dict[str, Field[Any]]:
    return {f.name: f for f in fields(Settings)}


def from_env(env: Mapping[str, str] | None = None) -> Settings:
    """Build settings from ``LMSP_*`` variables; invalid values raise ``ValueError``."""
    env = os.environ if env is None else env
    changes: dict[str, object] = {}
    for name, spec in _fields().items():
        decl = spec.metadata.get(DECLARATION)
        if decl is not None and (text := env.get(decl.env)):
            changes[name] = decl.read(text)
    return Settings().with_overrides(**changes)
