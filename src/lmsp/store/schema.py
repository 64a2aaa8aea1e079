"""The schema's history: one list of steps, each in its SQLite and its PostgreSQL form.

A step is one change of the schema. :data:`STEPS` is the whole history, oldest first;
:mod:`lmsp.store.migrations` applies each step's ``sqlite`` form to SQLite under its
``sqlite_id``, :mod:`lmsp.store.pg_schema` its ``postgres`` form to PostgreSQL under its
``postgres_id``. The ids are what a database's ``_migrations`` ledger records: never
rename one, never change what a shipped step does; append new steps at the end, with
both forms (a test checks that every step has them).

PostgreSQL came later: its first migration, ``p001_schema``, is the PostgreSQL forms of
steps 1 to 8 run together on a blank database (their data moves have no rows to carry
over there); from step 9 on, a step is one migration in either dialect (``m009_nodes``,
``p009_nodes``).

A step is written once, in SQLite's words, and :func:`postgres` words it for
PostgreSQL: ``INTEGER`` → ``BIGINT`` (times and sizes outgrow 32 bits), ``REAL`` →
``DOUBLE PRECISION``, ``BLOB`` → ``BYTEA``, ``INTEGER PRIMARY KEY AUTOINCREMENT`` → an
identity column, and SQLite's table options (``STRICT``, ``WITHOUT ROWID``) dropped. What
the dialects say differently besides (JSON functions, triggers, a byte length) is a
:class:`Fork`, written for each; anything SQLite-only left in a shared part is refused
when this module loads.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: the PostgreSQL migration that holds steps 1 to 8
BASELINE = "p001_schema"


@dataclass(frozen=True)
class Fork:
    """A part of a step that each dialect words its own way (empty: nothing there)."""

    sqlite: str = ""
    postgres: str = ""


@dataclass(frozen=True)
class Step:
    """One change of the schema, as each dialect's ledger names it and runs it."""

    sqlite_id: str
    postgres_id: str
    sqlite: str
    postgres: str


_POSTGRES_WORDS = (
    (r"\bINTEGER PRIMARY KEY AUTOINCREMENT\b", "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY"),
    (r"\bINTEGER\b", "BIGINT"),
    (r"\bREAL\b", "DOUBLE PRECISION"),
    (r"\bBLOB\b", "BYTEA"),
    (r"\)\s*STRICT(?:,\s*WITHOUT ROWID)?;", ");"),
)
_SQLITE_ONLY = re.compile(
    r"\b(?:json_\w+|RAISE|CAST|length)\s*\(|\b(?:STRICT|WITHOUT ROWID|AUTOINCREMENT)\b",
    re.IGNORECASE,
)


def postgres(sql: str) -> str:
    """A shared part of a step in PostgreSQL's words (see the module's head)."""
    for pattern, words in _POSTGRES_WORDS:
        sql = re.sub(pattern, words, sql)
    if found := _SQLITE_ONLY.search(sql):
        raise ValueError(f"{found.group(0)!r} is SQLite's: write that part as a Fork")
    return sql


def step(sqlite_id: str, *parts: str | Fork, postgres_id: str = "") -> Step:
    """A step from its parts: shared text (worded for PostgreSQL by :func:`postgres`)
    and forks. ``m012_webhooks`` is ``p012_webhooks`` in PostgreSQL's ledger unless
    ``postgres_id`` says otherwise."""
    sqlite = "".join(p.sqlite if isinstance(p, Fork) else p for p in parts)
    pg = "".join(p.postgres if isinstance(p, Fork) else postgres(p) for p in parts)
    return Step(sqlite_id, postgres_id or "p" + sqlite_id[1:], sqlite, pg)


#: PostgreSQL turns every change of a task (its row, its event log) and of a watched
#: client column into a ``NOTIFY``: delivered at commit to every node, it wakes streams,
#: reaches a generating node with a cancel, and expires token caches (store/pg.py)
_NOTIFY_TRIGGERS = """
        CREATE FUNCTION lmsp_task_row_changed() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF TG_OP = 'DELETE' THEN
                PERFORM pg_notify('lmsp_tasks', OLD.id || ' deleted');
            ELSE
                PERFORM pg_notify('lmsp_tasks', NEW.id || ' ' || NEW.status);
            END IF;
            RETURN NULL;
        END $$;
        CREATE TRIGGER lmsp_watch_tasks AFTER UPDATE OR DELETE ON tasks
            FOR EACH ROW EXECUTE FUNCTION lmsp_task_row_changed();
        CREATE FUNCTION lmsp_task_logged() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM pg_notify('lmsp_tasks', NEW.task_id);
            RETURN NULL;
        END $$;
        CREATE TRIGGER lmsp_watch_task_events AFTER INSERT ON task_events
            FOR EACH ROW EXECUTE FUNCTION lmsp_task_logged();
        CREATE FUNCTION lmsp_clients_changed() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM pg_notify('lmsp_clients', '');
            RETURN NULL;
        END $$;
        CREATE TRIGGER lmsp_watch_clients
            AFTER INSERT OR DELETE
               OR UPDATE OF token_prefix, token_hash, scopes, name, revoked_at ON clients
            FOR EACH STATEMENT EXECUTE FUNCTION lmsp_clients_changed();
        """

STEPS: tuple[Step, ...] = (
    step(
        "m001_initial",
        """
        CREATE TABLE service_config (
            key TEXT PRIMARY KEY,
            value TEXT NOT NULL
        ) STRICT;

        CREATE TABLE clients (
            id TEXT PRIMARY KEY,
            name TEXT NOT NULL,
            token_prefix TEXT NOT NULL,
            token_hash TEXT NOT NULL UNIQUE,
            scopes TEXT NOT NULL,
            created_at INTEGER NOT NULL,
            last_used_at INTEGER,
            revoked_at INTEGER
        ) STRICT;

        CREATE TABLE models (
            id TEXT PRIMARY KEY,
            format TEXT NOT NULL,
            engine TEXT NOT NULL,
            digest TEXT NOT NULL,
            size_bytes INTEGER NOT NULL,
            owned_by TEXT NOT NULL,
            metadata TEXT NOT NULL DEFAULT '{}',
            position INTEGER NOT NULL,
            created_at INTEGER NOT NULL
        ) STRICT;

        CREATE TABLE responses (
            id TEXT PRIMARY KEY,
            client_id TEXT NOT NULL REFERENCES clients(id),
            model TEXT NOT NULL,
            model_digest TEXT,
            created_at INTEGER NOT NULL,
            request TEXT NOT NULL,
            background INTEGER NOT NULL,
            store INTEGER NOT NULL,""",
        # PostgreSQL begins after step 4: these two never were among its columns
        Fork(
            sqlite="""
            output_text TEXT,
            message_id TEXT NOT NULL,"""
        ),
        """
            usage TEXT,
            incomplete_reason TEXT
        ) STRICT;

        CREATE TABLE tasks (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            id TEXT NOT NULL UNIQUE,
            response_id TEXT NOT NULL UNIQUE REFERENCES responses(id) ON DELETE CASCADE,
            client_id TEXT NOT NULL REFERENCES clients(id),
            status TEXT NOT NULL CHECK (status IN
                ('queued','loading','running','cancelling','completed','failed','cancelled')),
            on_restart TEXT NOT NULL CHECK (on_restart IN ('fail','retry','resume')),
            attempt INTEGER NOT NULL DEFAULT 1,
            last_sequence_number INTEGER NOT NULL,
            created_at INTEGER NOT NULL,
            updated_at INTEGER NOT NULL,
            finished_at INTEGER,
            error_code TEXT,
            error_message TEXT,
            snapshot TEXT
        ) STRICT;
        CREATE INDEX tasks_status ON tasks(status, seq);
        CREATE INDEX tasks_client ON tasks(client_id, seq);
        CREATE INDEX tasks_finished ON tasks(finished_at) WHERE finished_at IS NOT NULL;

        CREATE TABLE task_events (
            task_id TEXT NOT NULL REFERENCES tasks(id) ON DELETE CASCADE,
            sequence_number INTEGER NOT NULL,
            type TEXT NOT NULL,
            data TEXT NOT NULL,
            created_at INTEGER NOT NULL,
            PRIMARY KEY (task_id, sequence_number)
        ) STRICT, WITHOUT ROWID;

        CREATE TABLE idempotency_keys (
            client_id TEXT NOT NULL REFERENCES clients(id),
            key TEXT NOT NULL,
            request_digest TEXT NOT NULL,
            status_code INTEGER NOT NULL,
            resource_id TEXT,
            created_at INTEGER NOT NULL,
            expires_at INTEGER NOT NULL,
            PRIMARY KEY (client_id, key)
        ) STRICT;
        CREATE INDEX idempotency_expiry ON idempotency_keys(expires_at);
        """,
        Fork(postgres=_NOTIFY_TRIGGERS),
        postgres_id=BASELINE,
    ),
    step(
        "m002_pairing",
        """
        CREATE TABLE pairing_requests (
            id TEXT PRIMARY KEY,
            user_code TEXT NOT NULL UNIQUE,
            client_name TEXT NOT NULL,
            scopes TEXT NOT NULL,
            status TEXT NOT NULL CHECK (status IN ('pending','approved','denied','claimed')),
            granted_scopes TEXT,
            client_id TEXT REFERENCES clients(id),
            created_at INTEGER NOT NULL,
            expires_at INTEGER NOT NULL,
            decided_at INTEGER,
            claimed_at INTEGER
        ) STRICT;
        CREATE INDEX pairing_expiry ON pairing_requests(expires_at);
        """,
        postgres_id=BASELINE,
    ),
    step(
        "m003_model_state",
        """
        ALTER TABLE models ADD COLUMN status TEXT NOT NULL DEFAULT 'ready'
            CHECK (status IN ('ready','corrupt'));
        ALTER TABLE models ADD COLUMN verified_at INTEGER;
        """,
        postgres_id=BASELINE,
    ),
    # a response's output becomes a list of output items (messages, function calls),
    # written when its task finishes; rows from before keep their text as one message
    step(
        "m004_output_items",
        """
        ALTER TABLE responses ADD COLUMN output TEXT;""",
        Fork(
            sqlite="""
        UPDATE responses SET output = json_array(json_object(
            'type', 'message',
            'id', message_id,
            'status', CASE WHEN incomplete_reason IS NULL THEN 'completed' ELSE 'incomplete' END,
            'role', 'assistant',
            'content', json_array(json_object(
                'type', 'output_text', 'text', output_text,
                'annotations', json_array(), 'logprobs', json_array()))))
        WHERE output_text IS NOT NULL;
        ALTER TABLE responses DROP COLUMN output_text;
        ALTER TABLE responses DROP COLUMN message_id;
        """,
            postgres="\n",
        ),
        postgres_id=BASELINE,
    ),
    # where a pairing request came from (the peer address): pending requests are
    # limited per source, and the operator sees and clears them by source
    step(
        "m005_pairing_source",
        """
        ALTER TABLE pairing_requests ADD COLUMN source TEXT NOT NULL DEFAULT '';
        CREATE INDEX pairing_source ON pairing_requests(source, status);
        """,
        postgres_id=BASELINE,
    ),
    # per-model sampling defaults (temperature, top_p, top_k, min_p, penalties): what a
    # request that does not name a value runs with; set on import and by PATCH
    step(
        "m006_model_defaults",
        """
        ALTER TABLE models ADD COLUMN defaults TEXT NOT NULL DEFAULT '{}';
        """,
        postgres_id=BASELINE,
    ),
    # a running task's token ids, appended in chunks (int32 little-endian, ``start``
    # the index of the first), so a flush no longer rewrites them all; the snapshot
    # JSON keeps the small fields, the count and a short tail (store/snapshots.py).
    # A snapshot written before this holds its tokens in the JSON and is read (and
    # carried over) as such.
    step(
        "m007_snapshot_tokens",
        """
        CREATE TABLE task_tokens (
            task_id TEXT NOT NULL REFERENCES tasks(id) ON DELETE CASCADE,
            start INTEGER NOT NULL,
            tokens BLOB NOT NULL,
            PRIMARY KEY (task_id, start)
        ) STRICT, WITHOUT ROWID;
        """,
        postgres_id=BASELINE,
    ),
    # a turn of a conversation names the response it continues instead of keeping a
    # copy of the whole history (which grew by the history's size every turn, files
    # included): ``previous_id``, followed back when the history is needed
    # (store/responses.py). A row whose predecessor is still stored drops its copy;
    # one whose predecessor is gone keeps it, so no conversation breaks here.
    step(
        "m008_history_by_reference",
        """
        ALTER TABLE responses ADD COLUMN previous_id TEXT;
        CREATE INDEX responses_previous ON responses(previous_id) WHERE previous_id IS NOT NULL;
        """,
        Fork(
            sqlite="""UPDATE responses SET
            previous_id = json_extract(request, '$.previous_response_id'),
            request = json_remove(request, '$.lmsp_history')
        WHERE json_extract(request, '$.previous_response_id') IS NOT NULL
          AND EXISTS (SELECT 1 FROM responses p
                      WHERE p.id = json_extract(responses.request, '$.previous_response_id'));
        """
        ),
        postgres_id=BASELINE,
    ),
    # nodes sharing one database (PostgreSQL; a single SQLite node keeps one row):
    # the node that claimed a task and the lease epoch it claimed it under, which
    # fences every write of that task (store/nodes.py)
    step(
        "m009_nodes",
        """
        ALTER TABLE tasks ADD COLUMN node_id TEXT;
        ALTER TABLE tasks ADD COLUMN lease_epoch INTEGER NOT NULL DEFAULT 0;
        CREATE INDEX tasks_node ON tasks(node_id) WHERE node_id IS NOT NULL;
        CREATE TABLE nodes (
            id TEXT PRIMARY KEY,
            epoch INTEGER NOT NULL,
            address TEXT NOT NULL,
            started_at REAL NOT NULL,
            heartbeat_at REAL NOT NULL,
            lease_expires_at REAL NOT NULL,
            status TEXT NOT NULL CHECK (status IN ('up','left','lost'))
        ) STRICT;
        """,
    ),
    # each node's clock skew (the database's clock minus the node's) at its last
    # lease renewal: leases are judged by the database's clock, ``lmsp doctor``
    # flags a node whose own clock is far off
    step(
        "m010_node_clock",
        """
        ALTER TABLE nodes ADD COLUMN clock_skew REAL;
        """,
    ),
    # another name for a model (store/aliases.py): clients with a fixed model name
    step(
        "m011_model_aliases",
        """
        CREATE TABLE model_aliases (
            alias TEXT PRIMARY KEY,
            model TEXT NOT NULL,
            created_at INTEGER NOT NULL
        ) STRICT;
        """,
    ),
    # webhooks (PROTOCOL.md section 9) and their transactional outbox: a delivery row
    # per (event, webhook), written in the transaction that finishes the task
    # (store/webhooks.py); ``claim``/``claimed_by`` and ``next_attempt_at`` are the
    # lease a sender holds while it tries
    step(
        "m012_webhooks",
        """
        CREATE TABLE webhooks (
            id TEXT PRIMARY KEY,
            client_id TEXT NOT NULL REFERENCES clients(id),
            url TEXT NOT NULL,
            events TEXT NOT NULL,
            description TEXT,
            all_clients INTEGER NOT NULL DEFAULT 0,
            secret TEXT NOT NULL,
            created_at INTEGER NOT NULL
        ) STRICT;
        CREATE INDEX webhooks_client ON webhooks(client_id);
        CREATE INDEX webhooks_all ON webhooks(all_clients) WHERE all_clients = 1;
        CREATE TABLE webhook_deliveries (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            event_id TEXT NOT NULL,
            webhook_id TEXT NOT NULL REFERENCES webhooks(id) ON DELETE CASCADE,
            type TEXT NOT NULL,
            response_id TEXT NOT NULL,
            client_id TEXT NOT NULL,
            created_at REAL NOT NULL,
            status TEXT NOT NULL CHECK (status IN ('pending','delivered','failed')),
            attempts INTEGER NOT NULL DEFAULT 0,
            next_attempt_at REAL NOT NULL,
            claim TEXT,
            claimed_by TEXT,
            last_attempt_at REAL,
            last_status INTEGER,
            last_error TEXT,
            delivered_at REAL,
            UNIQUE (webhook_id, event_id)
        ) STRICT;
        CREATE INDEX webhook_deliveries_due ON webhook_deliveries(next_attempt_at)
            WHERE status = 'pending';
        CREATE INDEX webhook_deliveries_done ON webhook_deliveries(last_attempt_at)
            WHERE status != 'pending';
        CREATE INDEX webhook_deliveries_of ON webhook_deliveries(webhook_id, seq);
        """,
    ),
    # the Conversations API (store/conversations.py): a conversation and its items,
    # in order (``seq``); a response made with ``conversation`` names it, and its
    # input and output are appended when it finishes. Retention never sweeps these.
    step(
        "m013_conversations",
        """
        CREATE TABLE conversations (
            id TEXT PRIMARY KEY,
            client_id TEXT NOT NULL REFERENCES clients(id),
            created_at INTEGER NOT NULL,
            updated_at INTEGER NOT NULL,
            metadata TEXT NOT NULL
        ) STRICT;
        CREATE INDEX conversations_client ON conversations(client_id);
        CREATE TABLE conversation_items (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            conversation_id TEXT NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
            id TEXT NOT NULL,
            item TEXT NOT NULL,
            response_id TEXT,
            created_at INTEGER NOT NULL
        ) STRICT;
        CREATE UNIQUE INDEX conversation_items_id ON conversation_items(conversation_id, id);
        CREATE INDEX conversation_items_order ON conversation_items(conversation_id, seq);
        ALTER TABLE responses ADD COLUMN conversation_id TEXT;
        """,
    ),
    # a model pulled from a hub (PROTOCOL.md section 12): the task that downloads it,
    # what it downloads (the files pinned to one commit, with the hub's SHA-256) and
    # how far it got: ``part`` the file being fetched, ``part_bytes`` its bytes on
    # disk that a progress event recorded (synced first), where a resume starts
    step(
        "m014_model_pulls",
        """
        CREATE TABLE model_pulls (
            task_id TEXT PRIMARY KEY REFERENCES tasks(id) ON DELETE CASCADE,
            ref TEXT NOT NULL,
            model_id TEXT NOT NULL,
            node TEXT NOT NULL DEFAULT '',
            repo TEXT NOT NULL,
            revision TEXT NOT NULL,
            quant TEXT NOT NULL,
            files TEXT NOT NULL,
            total_bytes INTEGER NOT NULL,
            part INTEGER NOT NULL DEFAULT 0,
            part_bytes INTEGER NOT NULL DEFAULT 0,
            bytes_done INTEGER NOT NULL DEFAULT 0,
            created_at INTEGER NOT NULL
        ) STRICT;
        CREATE INDEX model_pulls_ref ON model_pulls(ref, model_id);
        """,
    ),
    # MCP tools' header values (tokens for the servers), kept apart from the stored
    # request (which shows them redacted) and deleted with the response
    step(
        "m015_mcp_headers",
        """
        CREATE TABLE mcp_headers (
            response_id TEXT PRIMARY KEY REFERENCES responses(id) ON DELETE CASCADE,
            headers TEXT NOT NULL
        ) STRICT;
        """,
    ),
    # fair share (PROTOCOL.md 13): each client's limits (NULL: none) and its turn in
    # the claim order (``served``: when it last got a sequence, a counter), each
    # task's service tier (0 flex, 1 default, 2 priority), the usage ledger (per
    # client, model and UTC day; per client and minute for tokens_per_minute) and
    # the audit log (append-only, each row hashing the one before: store/audit.py)
    step(
        "m016_fair_share",
        """
        ALTER TABLE clients ADD COLUMN max_queued INTEGER;
        ALTER TABLE clients ADD COLUMN max_running INTEGER;
        ALTER TABLE clients ADD COLUMN tokens_per_minute INTEGER;
        ALTER TABLE clients ADD COLUMN tokens_per_day INTEGER;
        ALTER TABLE clients ADD COLUMN served INTEGER NOT NULL DEFAULT 0;
        ALTER TABLE tasks ADD COLUMN tier INTEGER NOT NULL DEFAULT 1;
        CREATE INDEX tasks_client_status ON tasks(client_id, status);
        CREATE INDEX tasks_queue ON tasks(status, tier, client_id, seq);
        CREATE TABLE usage_daily (
            client_id TEXT NOT NULL,
            model TEXT NOT NULL,
            day TEXT NOT NULL,
            requests INTEGER NOT NULL,
            input_tokens INTEGER NOT NULL,
            cached_tokens INTEGER NOT NULL,
            output_tokens INTEGER NOT NULL,
            PRIMARY KEY (client_id, model, day)
        ) STRICT;
        CREATE INDEX usage_day ON usage_daily(day);
        CREATE TABLE usage_minutes (
            client_id TEXT NOT NULL,
            minute INTEGER NOT NULL,
            tokens INTEGER NOT NULL,
            PRIMARY KEY (client_id, minute)
        ) STRICT, WITHOUT ROWID;
        CREATE TABLE audit_log (
            id INTEGER PRIMARY KEY,
            at INTEGER NOT NULL,
            actor TEXT NOT NULL,
            action TEXT NOT NULL,
            target TEXT NOT NULL,
            change TEXT NOT NULL,
            prev_hash TEXT NOT NULL,
            hash TEXT NOT NULL
        ) STRICT;
        """,
        Fork(
            sqlite="""CREATE TRIGGER audit_log_no_update BEFORE UPDATE ON audit_log
        BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END;
        CREATE TRIGGER audit_log_no_delete BEFORE DELETE ON audit_log
        BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END;
        """,
            postgres="""
        CREATE FUNCTION lmsp_audit_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            RAISE EXCEPTION 'the audit log is append-only';
        END $$;
        CREATE TRIGGER lmsp_audit_append_only BEFORE UPDATE OR DELETE ON audit_log
            FOR EACH ROW EXECUTE FUNCTION lmsp_audit_append_only();
        """,
        ),
    ),
    # a webhook's last change of its URL, events, description or secret (the
    # ``/v1/webhook_endpoints`` face shows it as ``updated_at``); rows made before
    # it were never changed, so they start at their creation
    step(
        "m017_webhook_updated_at",
        """
        ALTER TABLE webhooks ADD COLUMN updated_at INTEGER;
        UPDATE webhooks SET updated_at = created_at;
        """,
    ),
    # a conversation's size, counted as items come and go (its quotas, the sum of a
    # client's), from what each one holds now; retention sweeps the unused ones
    # (``updated_at``) once no response of theirs is stored
    step(
        "m018_conversation_sizes",
        """
        ALTER TABLE conversations ADD COLUMN item_count INTEGER NOT NULL DEFAULT 0;
        ALTER TABLE conversations ADD COLUMN item_bytes INTEGER NOT NULL DEFAULT 0;
        UPDATE conversations SET
            item_count = (SELECT COUNT(*) FROM conversation_items i
                          WHERE i.conversation_id = conversations.id),
            item_bytes = (SELECT COALESCE(SUM(""",
        Fork(sqlite="length(CAST(i.item AS BLOB))", postgres="octet_length(i.item)"),
        """), 0)
                          FROM conversation_items i WHERE i.conversation_id = conversations.id);
        CREATE INDEX conversations_updated ON conversations(updated_at);
        CREATE INDEX responses_conversation ON responses(conversation_id)
            WHERE conversation_id IS NOT NULL;
        """,
    ),
    # a model served by a remote upstream (llama-server, vLLM, SGLang): where it is,
    # how it is reached, and what it was found able to do when added (JSON; NULL for a
    # model lmsp runs itself). Its blob is its tokenizer.
    step(
        "m019_remote_models",
        """
        ALTER TABLE models ADD COLUMN remote TEXT;
        """,
    ),
)


def sqlite_migrations() -> list[tuple[str, str]]:
    """SQLite's migrations: each step, by its id."""
    return [(s.sqlite_id, s.sqlite) for s in STEPS]


def postgres_migrations() -> list[tuple[str, str]]:
    """PostgreSQL's migrations: each step by its id, the steps that share one (steps 1
    to 8, :data:`BASELINE`) run as one."""
    out: list[tuple[str, str]] = []
    for s in STEPS:
        if out and out[-1][0] == s.postgres_id:
            out[-1] = (s.postgres_id, out[-1][1] + s.postgres)
        else:
            out.append((s.postgres_id, s.postgres))
    return out
