"""Named, idempotent schema migrations. This module owns the whole schema.

Each migration runs once, in its own ``BEGIN IMMEDIATE`` transaction together with the
row that records it in ``_migrations``; running :func:`migrate` again changes nothing.
Append new migrations at the end; never edit one that has shipped.
"""

from __future__ import annotations

import sqlite3
import time

MIGRATIONS: list[tuple[str, str]] = [
    (
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
            store INTEGER NOT NULL,
            output_text TEXT,
            message_id TEXT NOT NULL,
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
    ),
    (
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
    ),
    (
        "m003_model_state",
        """
        ALTER TABLE models ADD COLUMN status TEXT NOT NULL DEFAULT 'ready'
            CHECK (status IN ('ready','corrupt'));
        ALTER TABLE models ADD COLUMN verified_at INTEGER;
        """,
    ),
    (
        # a response's output becomes a list of output items (messages, function calls),
        # written when its task finishes; rows from before keep their text as one message
        "m004_output_items",
        """
        ALTER TABLE responses ADD COLUMN output TEXT;
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
    ),
    (
        # where a pairing request came from (the peer address): pending requests are
        # limited per source, and the operator sees and clears them by source
        "m005_pairing_source",
        """
        ALTER TABLE pairing_requests ADD COLUMN source TEXT NOT NULL DEFAULT '';
        CREATE INDEX pairing_source ON pairing_requests(source, status);
        """,
    ),
    (
        # per-model sampling defaults (temperature, top_p, top_k, min_p, penalties): what a
        # request that does not name a value runs with; set on import and by PATCH
        "m006_model_defaults",
        """
        ALTER TABLE models ADD COLUMN defaults TEXT NOT NULL DEFAULT '{}';
        """,
    ),
    (
        # a running task's token ids, appended in chunks (int32 little-endian, ``start``
        # the index of the first), so a flush no longer rewrites them all; the snapshot
        # JSON keeps the small fields, the count and a short tail (store/snapshots.py).
        # A snapshot written before this holds its tokens in the JSON and is read (and
        # carried over) as such.
        "m007_snapshot_tokens",
        """
        CREATE TABLE task_tokens (
            task_id TEXT NOT NULL REFERENCES tasks(id) ON DELETE CASCADE,
            start INTEGER NOT NULL,
            tokens BLOB NOT NULL,
            PRIMARY KEY (task_id, start)
        ) STRICT, WITHOUT ROWID;
        """,
    ),
    (
        # a turn of a conversation names the response it continues instead of keeping a
        # copy of the whole history (which grew by the history's size every turn, files
        # included): ``previous_id``, followed back when the history is needed
        # (store/responses.py). A row whose predecessor is still stored drops its copy;
        # one whose predecessor is gone keeps it, so no conversation breaks here.
        "m008_history_by_reference",
        """
        ALTER TABLE responses ADD COLUMN previous_id TEXT;
        CREATE INDEX responses_previous ON responses(previous_id) WHERE previous_id IS NOT NULL;
        UPDATE responses SET
            previous_id = json_extract(request, '$.previous_response_id'),
            request = json_remove(request, '$.lmsp_history')
        WHERE json_extract(request, '$.previous_response_id') IS NOT NULL
          AND EXISTS (SELECT 1 FROM responses p
                      WHERE p.id = json_extract(responses.request, '$.previous_response_id'));
        """,
    ),
    (
        # nodes sharing one database (PostgreSQL; a single SQLite node keeps one row):
        # the node that claimed a task and the lease epoch it claimed it under, which
        # fences every write of that task (store/nodes.py)
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
    (
        # each node's clock skew (the database's clock minus the node's) at its last
        # lease renewal: leases are judged by the database's clock, ``lmsp doctor``
        # flags a node whose own clock is far off
        "m010_node_clock",
        """
        ALTER TABLE nodes ADD COLUMN clock_skew REAL;
        """,
    ),
    (
        # another name for a model (store/aliases.py): clients with a fixed model name
        "m011_model_aliases",
        """
        CREATE TABLE model_aliases (
            alias TEXT PRIMARY KEY,
            model TEXT NOT NULL,
            created_at INTEGER NOT NULL
        ) STRICT;
        """,
    ),
    (
        # webhooks (PROTOCOL.md section 9) and their transactional outbox: a delivery row
        # per (event, webhook), written in the transaction that finishes the task
        # (store/webhooks.py); ``claim``/``claimed_by`` and ``next_attempt_at`` are the
        # lease a sender holds while it tries
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
    (
        # the Conversations API (store/conversations.py): a conversation and its items,
        # in order (``seq``); a response made with ``conversation`` names it, and its
        # input and output are appended when it finishes. Retention never sweeps these.
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
    (
        # a model pulled from a hub (PROTOCOL.md section 12): the task that downloads it,
        # what it downloads (the files pinned to one commit, with the hub's SHA-256) and
        # how far it got: ``part`` the file being fetched, ``part_bytes`` its bytes on
        # disk that a progress event recorded (synced first), where a resume starts
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
    (
        "m015_mcp_headers",
        # MCP tools' header values (tokens for the servers), kept apart from the stored
        # request (which shows them redacted) and deleted with the response
        """
        CREATE TABLE mcp_headers (
            response_id TEXT PRIMARY KEY REFERENCES responses(id) ON DELETE CASCADE,
            headers TEXT NOT NULL
        ) STRICT;
        """,
    ),
    (
        # fair share (PROTOCOL.md 13): each client's limits (NULL: none) and its turn in
        # the claim order (``served``: when it last got a sequence, a counter), each
        # task's service tier (0 flex, 1 default, 2 priority), the usage ledger (per
        # client, model and UTC day; per client and minute for tokens_per_minute) and
        # the audit log (append-only, each row hashing the one before: store/audit.py)
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
        CREATE TRIGGER audit_log_no_update BEFORE UPDATE ON audit_log
        BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END;
        CREATE TRIGGER audit_log_no_delete BEFORE DELETE ON audit_log
        BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END;
        """,
    ),
    (
        # a webhook's last change of its URL, events, description or secret (the
        # ``/v1/webhook_endpoints`` face shows it as ``updated_at``); rows made before
        # it were never changed, so they start at their creation
        "m017_webhook_updated_at",
        """
        ALTER TABLE webhooks ADD COLUMN updated_at INTEGER;
        UPDATE webhooks SET updated_at = created_at;
        """,
    ),
    (
        # a conversation's size, counted as items come and go (its quotas, the sum of a
        # client's), from what each one holds now; retention sweeps the unused ones
        # (``updated_at``) once no response of theirs is stored
        "m018_conversation_sizes",
        """
        ALTER TABLE conversations ADD COLUMN item_count INTEGER NOT NULL DEFAULT 0;
        ALTER TABLE conversations ADD COLUMN item_bytes INTEGER NOT NULL DEFAULT 0;
        UPDATE conversations SET
            item_count = (SELECT COUNT(*) FROM conversation_items i
                          WHERE i.conversation_id = conversations.id),
            item_bytes = (SELECT COALESCE(SUM(length(CAST(i.item AS BLOB))), 0)
                          FROM conversation_items i WHERE i.conversation_id = conversations.id);
        CREATE INDEX conversations_updated ON conversations(updated_at);
        CREATE INDEX responses_conversation ON responses(conversation_id)
            WHERE conversation_id IS NOT NULL;
        """,
    ),
]


def _ensure_ledger(conn: sqlite3.Connection) -> None:
    conn.execute(
        "CREATE TABLE IF NOT EXISTS _migrations ("
        " name TEXT PRIMARY KEY, applied_at INTEGER NOT NULL) STRICT"
    )


def applied(conn: sqlite3.Connection) -> list[str]:
    _ensure_ledger(conn)
    return [row[0] for row in conn.execute("SELECT name FROM _migrations ORDER BY name")]


def migrate(conn: sqlite3.Connection) -> list[str]:
    """Apply every migration not yet recorded; return the names applied now."""
    _ensure_ledger(conn)
    done: list[str] = []
    for name, sql in MIGRATIONS:
        conn.execute("BEGIN IMMEDIATE")
        try:
            if conn.execute("SELECT 1 FROM _migrations WHERE name = ?", (name,)).fetchone():
                conn.execute("ROLLBACK")
                continue
            for statement in _statements(sql):
                conn.execute(statement)
            conn.execute(
                "INSERT INTO _migrations (name, applied_at) VALUES (?, ?)", (name, int(time.time()))
            )
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        done.append(name)
    return done


def _statements(sql: str) -> list[str]:
    """Split a migration into statements (``executescript`` would commit on its own)."""
    parts: list[str] = []
    buf = ""
    for line in sql.splitlines(keepends=True):
        buf += line
        if sqlite3.complete_statement(buf):
            if buf.strip():
                parts.append(buf.strip())
            buf = ""
    if buf.strip():
        parts.append(buf.strip())
    return parts


def schema_version(conn: sqlite3.Connection) -> str | None:
    names = applied(conn)
    return names[-1] if names else None
