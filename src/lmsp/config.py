"""Service configuration: one place that reads the environment."""

from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass, field, replace
from pathlib import Path

ON_RESTART_POLICIES = ("fail", "retry", "resume")

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, None: 1}


def parse_duration(text: str) -> float:
    """Parse ``30s``, ``12h``, ``7d``, ``250ms`` or a bare number of seconds."""
    match = _DURATION.match(text)
    if not match:
        raise ValueError(f"invalid duration {text!r} (use e.g. 30s, 15m, 12h, 7d)")
    return float(match.group(1)) * _UNIT_SECONDS[match.group(2)]


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
    data_dir: Path = field(default_factory=default_data_dir)
    host: str = "127.0.0.1"
    port: int = 8430
    retention: float = 7 * 86400.0
    # conversations unused this long are deleted; 0: never (PROTOCOL.md 10, the default)
    conversation_retention: float = 0.0
    default_on_restart: str = "fail"
    parallel: int = 4  # sequences decoded together: the best of 1, 2, 4, 8 (docs/performance.md)
    # sequences more, each taken only by a client with nothing running while the others
    # are busy: its first request starts at once (PROTOCOL.md 13, docs/operations.md)
    reserved_sequences: int = 1
    max_body_bytes: int = 1 << 20
    max_queue: int = 1024
    idempotency_ttl: float = 86400.0
    gc_interval: float = 60.0
    flush_interval: float = 0.1
    n_ctx: int = 0  # one sequence's context; 0: the model's trained context (SmolLM2: 8192)
    # bytes the KV caches of one model's sequences may take together; the context is cut
    # to fit (docs/operations.md). Default: a quarter of the machine's memory
    kv_budget: int = field(default_factory=lambda: default_kv_budget())
    # LMSP_EXACT: batched = solo and resumed = uninterrupted, bit for bit, at a cost
    # (docs/performance.md); off: llama-server's fast schedule
    exact: bool = False
    # LMSP_ROPE_SCALING: a context past the model's trained one (LMSP_N_CTX) is stretched
    # with YaRN (``yarn``, the default), or not (``none``: positions it never saw)
    rope_scaling: bool = True
    keep_alive: float = 300.0
    max_loaded_models: int = 1
    enable_test_engine: bool = False
    sse_ping: float = 15.0
    cancel_wait: float = 5.0
    pairing_ttl: float = 600.0
    max_pending_pairings: int = 64
    max_pending_pairings_per_source: int = 4  # a peer beyond this machine (not loopback)
    max_pending_pairings_per_name: int = 4  # one client name, whatever its peer
    header_timeout: float = 10.0
    body_timeout: float = 30.0
    max_connections: int = 1000
    max_header_bytes: int = 64 * 1024  # the request line and headers, in all
    max_headers: int = 100  # header fields in one request
    allowed_hosts: tuple[str, ...] = ()  # Host names answered besides the bound ones
    trusted_proxies: tuple[str, ...] = ()  # peers whose X-Forwarded-* is believed
    http: str = "auto"  # the HTTP parser: auto (httptools when installed), httptools, h11
    log_format: str = "text"  # or "json": one JSON object a line
    kv_cache_bytes: int = 2 << 30  # the durable prefix cache's size; 0 turns it off
    kv_cache_ttl: float = 7 * 86400.0  # a saved prefix unused this long is deleted
    # free space the prefix cache leaves on the data directory's disk (None: a tenth of
    # the disk, at most 4 GiB): it never takes the room durable writes need
    kv_cache_reserve: int | None = None
    # untrusted input read in worker processes (lmsp.sandbox): their number, the memory
    # each may map, the CPU time one file may take to become text and one request's
    # schemas to compile, and the size of those schemas
    input_workers: int = 2
    input_memory: int = 512 << 20
    file_cpu_time: float = 5.0
    schema_cpu_time: float = 2.0
    max_schema_bytes: int = 256 << 10
    # a crashed engine is started again at most this many times within the window; the
    # next crash marks its model failed (docs/operations.md)
    engine_restarts: int = 5
    engine_restart_window: float = 600.0
    # POST /v1/embeddings: the most inputs one request may have, and the most tokens one
    # input may have (also the size of each engine's embedding context)
    embed_max_inputs: int = 256
    embed_max_tokens: int = 512
    # engines run on a thread of the API process instead of a process of their own: for
    # fast in-process tests of the test engine only (no environment variable sets it)
    in_thread_engines: frozenset[str] = frozenset()
    # several nodes on one PostgreSQL database (docs/scale-out.md): its URL (None: the
    # embedded SQLite database of the data directory), this node's id (None: host and
    # port) and how long a node's lease on its tasks lasts without a renewal
    database_url: str | None = None
    node_id: str | None = None
    lease_ttl: float = 15.0
    # LMSP_DEFAULT_LIMITS: the limits a new client gets (PROTOCOL.md 13), as
    # ``(name, value)`` pairs; the owner is never limited
    default_limits: tuple[tuple[str, int], ...] = ()
    # the model hub ``lmsp pull`` reads (LMSP_HF_ENDPOINT) and the token for its gated
    # repositories (HF_TOKEN; never shown: not in this object's repr, never logged)
    hf_endpoint: str = "https://huggingface.co"
    hf_token: str | None = field(default=None, repr=False)
    # webhooks (docs/webhooks.md): the first wait before a failed delivery is tried
    # again (then doubling), how long it is tried at all, and the hosts beyond loopback
    # a webhook may name (``host[:port]`` entries; ``*`` any)
    webhook_retry: float = 5.0
    webhook_give_up: float = 86400.0
    webhook_hosts: str = ""
    # shared work under a hostile client (docs/reliability.md): the most tokens one
    # embeddings request may have in all, the part of an engine's time embedding batches
    # may take while sequences generate, and the CPU time one request's files and schemas
    # may take together (its wall-clock limit counted from its arrival)
    embed_request_tokens: int = 32768
    embed_share: float = 1 / 4
    request_cpu_time: float = 10.0
    # the most a node's clock may differ from the shared database's before `lmsp doctor`
    # fails it (everything that ages is judged by the database's clock regardless)
    max_clock_skew: float = 30.0
    # MCP tools (docs/tools.md): hosts besides loopback a server_url may name
    # (LMSP_MCP_HOSTS, host[:port] comma-separated, * for any), the time one MCP request
    # may take (LMSP_MCP_TIMEOUT), the most characters of a tool result kept and the
    # most bytes read from a server for one request (LMSP_MCP_MAX_BYTES: its whole
    # session, the tool list's pages or the call, cut off while they are read)
    mcp_hosts: tuple[str, ...] = ()
    mcp_timeout: float = 60.0
    mcp_max_result: int = 64 * 1024
    mcp_max_bytes: int = 1 << 20
    # conversations (docs/conversations.md): the most items one may hold, the most bytes
    # its stored items may take, and all of one client's conversations together (0: no
    # limit); past one, an append or a turn is refused (409 conversation_quota_exceeded)
    conversation_max_items: int = 10_000
    conversation_max_bytes: int = 32 << 20
    client_conversation_bytes: int = 1 << 30

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


def _flag(value: str) -> bool:
    return value.strip().lower() in {"1", "true", "yes", "on"}


def _names(value: str) -> tuple[str, ...]:
    """A comma-separated list (``LMSP_ALLOWED_HOSTS``, ``LMSP_TRUSTED_PROXIES``)."""
    return tuple(name.strip() for name in value.split(",") if name.strip())


def from_env(env: dict[str, str] | None = None) -> Settings:
    """Build settings from ``LMSP_*`` variables; invalid values raise ``ValueError``."""
    env = dict(os.environ if env is None else env)
    s = Settings()
    changes: dict[str, object] = {}
    if v := env.get("LMSP_DATA_DIR"):
        changes["data_dir"] = Path(v).expanduser()
    if v := env.get("LMSP_HOST"):
        changes["host"] = v
    if v := env.get("LMSP_PORT"):
        changes["port"] = int(v)
    if v := env.get("LMSP_RETENTION"):
        changes["retention"] = parse_duration(v)
    if v := env.get("LMSP_CONVERSATION_RETENTION"):
        changes["conversation_retention"] = parse_duration(v)
    if v := env.get("LMSP_DEFAULT_ON_RESTART"):
        if v not in ON_RESTART_POLICIES:
            raise ValueError(f"LMSP_DEFAULT_ON_RESTART must be one of {ON_RESTART_POLICIES}")
        changes["default_on_restart"] = v
    if v := env.get("LMSP_PARALLEL"):
        changes["parallel"] = int(v)
        if int(v) < 1:
            raise ValueError("LMSP_PARALLEL must be at least 1")
    if v := env.get("LMSP_RESERVED_SEQUENCES"):
        changes["reserved_sequences"] = int(v)
        if not 0 <= int(v) <= 8:
            raise ValueError("LMSP_RESERVED_SEQUENCES must be from 0 to 8")
    if v := env.get("LMSP_MAX_BODY_BYTES"):
        changes["max_body_bytes"] = int(v)
    if v := env.get("LMSP_MAX_QUEUE"):
        changes["max_queue"] = int(v)
    if v := env.get("LMSP_IDEMPOTENCY_TTL"):
        changes["idempotency_ttl"] = parse_duration(v)
    if v := env.get("LMSP_GC_INTERVAL"):
        changes["gc_interval"] = parse_duration(v)
    if v := env.get("LMSP_N_CTX"):
        changes["n_ctx"] = int(v)
        if int(v) < 0:
            raise ValueError("LMSP_N_CTX must be 0 (the model's own) or more")
    if v := env.get("LMSP_KV_BUDGET"):
        changes["kv_budget"] = int(v)
        if int(v) < 1 << 20:
            raise ValueError("LMSP_KV_BUDGET must be at least 1048576 bytes")
    if v := env.get("LMSP_ROPE_SCALING"):
        if v not in ("yarn", "none"):
            raise ValueError("LMSP_ROPE_SCALING must be yarn or none")
        changes["rope_scaling"] = v == "yarn"
    if v := env.get("LMSP_EXACT"):
        changes["exact"] = _flag(v)
    if v := env.get("LMSP_KEEP_ALIVE"):
        changes["keep_alive"] = parse_duration(v)
    if v := env.get("LMSP_FLUSH_INTERVAL"):
        changes["flush_interval"] = flush = float(parse_duration(v))
        if not 0.005 <= flush <= 1.0:
            raise ValueError("LMSP_FLUSH_INTERVAL must be between 5ms and 1s")
    if v := env.get("LMSP_MAX_LOADED_MODELS"):
        changes["max_loaded_models"] = int(v)
        if int(v) < 1:
            raise ValueError("LMSP_MAX_LOADED_MODELS must be at least 1")
    if v := env.get("LMSP_PAIRING_TTL"):
        changes["pairing_ttl"] = ttl = parse_duration(v)
        if ttl < 1:
            raise ValueError("LMSP_PAIRING_TTL must be at least 1s")
    if v := env.get("LMSP_MAX_PENDING_PAIRINGS"):
        changes["max_pending_pairings"] = int(v)
        if int(v) < 1:
            raise ValueError("LMSP_MAX_PENDING_PAIRINGS must be at least 1")
    if v := env.get("LMSP_MAX_PENDING_PAIRINGS_PER_SOURCE"):
        changes["max_pending_pairings_per_source"] = int(v)
        if int(v) < 1:
            raise ValueError("LMSP_MAX_PENDING_PAIRINGS_PER_SOURCE must be at least 1")
    timeouts = (("LMSP_HEADER_TIMEOUT", "header_timeout"), ("LMSP_BODY_TIMEOUT", "body_timeout"))
    for name, key in timeouts:
        if v := env.get(name):
            changes[key] = seconds = parse_duration(v)
            if seconds <= 0:
                raise ValueError(f"{name} must be more than 0s")
    if v := env.get("LMSP_MAX_PENDING_PAIRINGS_PER_NAME"):
        changes["max_pending_pairings_per_name"] = int(v)
        if int(v) < 1:
            raise ValueError("LMSP_MAX_PENDING_PAIRINGS_PER_NAME must be at least 1")
    if v := env.get("LMSP_MAX_HEADER_BYTES"):
        changes["max_header_bytes"] = int(v)
        if int(v) < 1024:
            raise ValueError("LMSP_MAX_HEADER_BYTES must be at least 1024")
    if v := env.get("LMSP_MAX_HEADERS"):
        changes["max_headers"] = int(v)
        if int(v) < 8:
            raise ValueError("LMSP_MAX_HEADERS must be at least 8")
    if v := env.get("LMSP_ALLOWED_HOSTS"):
        changes["allowed_hosts"] = _names(v)
    if v := env.get("LMSP_TRUSTED_PROXIES"):
        changes["trusted_proxies"] = _names(v)
    if v := env.get("LMSP_HTTP"):
        if v not in ("auto", "httptools", "h11"):
            raise ValueError("LMSP_HTTP must be auto, httptools or h11")
        changes["http"] = v
    if v := env.get("LMSP_MAX_CONNECTIONS"):
        changes["max_connections"] = int(v)
        if int(v) < 1:
            raise ValueError("LMSP_MAX_CONNECTIONS must be at least 1")
    if v := env.get("LMSP_SSE_PING"):
        changes["sse_ping"] = parse_duration(v)
    if v := env.get("LMSP_CANCEL_WAIT"):
        changes["cancel_wait"] = parse_duration(v)
    if v := env.get("LMSP_DATABASE_URL"):
        if not v.startswith(("postgresql://", "postgres://")):
            raise ValueError("LMSP_DATABASE_URL must be a postgresql:// URL")
        changes["database_url"] = v
    if v := env.get("LMSP_NODE_ID"):
        changes["node_id"] = v
    if v := env.get("LMSP_LEASE_TTL"):
        changes["lease_ttl"] = ttl = parse_duration(v)
        if ttl < 1:
            raise ValueError("LMSP_LEASE_TTL must be at least 1s")
    if v := env.get("LMSP_LOG_FORMAT"):
        if v not in ("text", "json"):
            raise ValueError("LMSP_LOG_FORMAT must be text or json")
        changes["log_format"] = v
    if v := env.get("LMSP_KV_CACHE_BYTES"):
        changes["kv_cache_bytes"] = int(v)
        if int(v) < 0:
            raise ValueError("LMSP_KV_CACHE_BYTES must be 0 (off) or more")
    if v := env.get("LMSP_KV_CACHE_TTL"):
        changes["kv_cache_ttl"] = ttl = parse_duration(v)
        if ttl <= 0:
            raise ValueError("LMSP_KV_CACHE_TTL must be more than 0s")
    if v := env.get("LMSP_KV_CACHE_RESERVE"):
        changes["kv_cache_reserve"] = int(v)
        if int(v) < 0:
            raise ValueError("LMSP_KV_CACHE_RESERVE must be 0 or more bytes")
    for name, key, least in (
        ("LMSP_INPUT_WORKERS", "input_workers", 1),
        ("LMSP_INPUT_MEMORY", "input_memory", 64 << 20),
        ("LMSP_MAX_SCHEMA_BYTES", "max_schema_bytes", 1),
    ):
        if v := env.get(name):
            changes[key] = int(v)
            if int(v) < least:
                raise ValueError(f"{name} must be at least {least}")
    for name, key in (
        ("LMSP_FILE_CPU_TIME", "file_cpu_time"),
        ("LMSP_SCHEMA_CPU_TIME", "schema_cpu_time"),
    ):
        if v := env.get(name):
            changes[key] = seconds = parse_duration(v)
            if seconds <= 0:
                raise ValueError(f"{name} must be more than 0s")
    if v := env.get("LMSP_ENGINE_RESTARTS"):
        changes["engine_restarts"] = int(v)
        if int(v) < 0:
            raise ValueError("LMSP_ENGINE_RESTARTS must be 0 or more")
    if v := env.get("LMSP_ENGINE_RESTART_WINDOW"):
        changes["engine_restart_window"] = window = parse_duration(v)
        if window <= 0:
            raise ValueError("LMSP_ENGINE_RESTART_WINDOW must be more than 0s")
    for name, key in (
        ("LMSP_EMBED_MAX_INPUTS", "embed_max_inputs"),
        ("LMSP_EMBED_MAX_TOKENS", "embed_max_tokens"),
    ):
        if v := env.get(name):
            changes[key] = int(v)
            if int(v) < 1:
                raise ValueError(f"{name} must be at least 1")
    if v := env.get("LMSP_ENABLE_TEST_ENGINE"):
        changes["enable_test_engine"] = _flag(v)
    if v := env.get("LMSP_DEFAULT_LIMITS"):
        changes["default_limits"] = parse_limits(v)
    if v := env.get("LMSP_HF_ENDPOINT"):
        if not v.startswith(("http://", "https://")):
            raise ValueError("LMSP_HF_ENDPOINT must be an http(s):// URL")
        changes["hf_endpoint"] = v.rstrip("/")
    if v := env.get("HF_TOKEN"):
        changes["hf_token"] = v.strip()
    if v := env.get("LMSP_WEBHOOK_RETRY"):
        changes["webhook_retry"] = seconds = parse_duration(v)
        if seconds <= 0:
            raise ValueError("LMSP_WEBHOOK_RETRY must be more than 0s")
    if v := env.get("LMSP_WEBHOOK_GIVE_UP"):
        changes["webhook_give_up"] = seconds = parse_duration(v)
        if seconds <= 0:
            raise ValueError("LMSP_WEBHOOK_GIVE_UP must be more than 0s")
    if v := env.get("LMSP_WEBHOOK_HOSTS"):
        from lmsp.protocol.webhooks import parse_hosts

        parse_hosts(v)  # a malformed entry stops the start, saying which
        changes["webhook_hosts"] = v
    _shared_work(env, changes)
    _conversations(env, changes)
    if v := env.get("LMSP_MAX_CLOCK_SKEW"):
        changes["max_clock_skew"] = skew = parse_duration(v)
        if skew <= 0:
            raise ValueError("LMSP_MAX_CLOCK_SKEW must be more than 0s")
    if v := env.get("LMSP_MCP_HOSTS"):
        from lmsp.protocol.outbound import parse_hosts as parse_outbound

        parse_outbound(v, "LMSP_MCP_HOSTS")  # a malformed entry stops the start, saying which
        changes["mcp_hosts"] = _names(v)
    if v := env.get("LMSP_MCP_TIMEOUT"):
        changes["mcp_timeout"] = seconds = parse_duration(v)
        if seconds <= 0:
            raise ValueError("LMSP_MCP_TIMEOUT must be more than 0s")
    if v := env.get("LMSP_MCP_MAX_RESULT"):
        changes["mcp_max_result"] = int(v)
        if int(v) < 1:
            raise ValueError("LMSP_MCP_MAX_RESULT must be at least 1")
    if v := env.get("LMSP_MCP_MAX_BYTES"):
        changes["mcp_max_bytes"] = int(v)
        if int(v) < 4096:
            raise ValueError("LMSP_MCP_MAX_BYTES must be at least 4096")
    return s.with_overrides(**changes)


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


def _shared_work(env: dict[str, str], changes: dict[str, object]) -> None:
    """The limits that keep one client's work from starving the others."""
    if v := env.get("LMSP_EMBED_REQUEST_TOKENS"):
        changes["embed_request_tokens"] = int(v)
        if int(v) < 1:
            raise ValueError("LMSP_EMBED_REQUEST_TOKENS must be at least 1")
    if v := env.get("LMSP_EMBED_SHARE"):
        changes["embed_share"] = share = float(v)
        if not 0.01 <= share <= 1:
            raise ValueError("LMSP_EMBED_SHARE must be between 0.01 and 1")
    if v := env.get("LMSP_REQUEST_CPU_TIME"):
        changes["request_cpu_time"] = seconds = parse_duration(v)
        if seconds <= 0:
            raise ValueError("LMSP_REQUEST_CPU_TIME must be more than 0s")


def _conversations(env: dict[str, str], changes: dict[str, object]) -> None:
    """The quotas of conversations (0: no limit)."""
    for name, key in (
        ("LMSP_CONVERSATION_MAX_ITEMS", "conversation_max_items"),
        ("LMSP_CONVERSATION_MAX_BYTES", "conversation_max_bytes"),
        ("LMSP_CLIENT_CONVERSATION_BYTES", "client_conversation_bytes"),
    ):
        if v := env.get(name):
            changes[key] = int(v)
            if int(v) < 0:
                raise ValueError(f"{name} must be 0 (no limit) or more")
