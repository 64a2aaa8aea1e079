"""The PostgreSQL schema: named, idempotent migrations, as :mod:`lmsp.store.migrations`
is for SQLite.

``p001_schema`` is the SQLite schema as its migrations ``m001`` … ``m008`` leave it,
written for PostgreSQL (``BIGINT`` for every integer: times and sizes outgrow 32 bits;
``BYTEA`` for blobs; an identity column for the queue order). Later migrations
follow both dialects in step (``p009_nodes`` is ``m009_nodes``). Each migration runs in
one transaction under an advisory lock, so nodes starting together apply it once.

Triggers turn every change of a task (its row, its event log) and of a watched client
column into a ``NOTIFY``: delivered at commit to every node, it wakes streams, reaches a
generating node with a cancel, and expires token caches (:mod:`lmsp.store.pg`).
"""

from __future__ import annotations

import time
from typing import Any

#: the advisory lock id migrations hold ("lmsp" in ASCII)
LOCK_ID = 0x6C6D7370

TASKS_CHANNEL = "lmsp_tasks"
CLIENTS_CHANNEL = "lmsp_clients"

MIGRATIONS: list[tuple[str, str]] = [
    (
        "p001_schema",
        """
        CREATE TABLE service_config (
            key TEXT PRIMARY KEY,
            value TEXT NOT NULL
        );
        CREATE TABLE clients (
            id TEXT PRIMARY KEY,
            name TEXT NOT NULL,
            token_prefix TEXT NOT NULL,
            token_hash TEXT NOT NULL UNIQUE,
            scopes TEXT NOT NULL,
            created_at BIGINT NOT NULL,
            last_used_at BIGINT,
            revoked_at BIGINT
        );
        CREATE TABLE models (
            id TEXT PRIMARY KEY,
            format TEXT NOT NULL,
            engine TEXT NOT NULL,
            digest TEXT NOT NULL,
            size_bytes BIGINT NOT NULL,
            owned_by TEXT NOT NULL,
            metadata TEXT NOT NULL DEFAULT '{}',
            position BIGINT NOT NULL,
            created_at BIGINT NOT NULL,
            status TEXT NOT NULL DEFAULT 'ready' CHECK (status IN ('ready','corrupt')),
            verified_at BIGINT,
            defaults TEXT NOT NULL DEFAULT '{}'
        );
        CREATE TABLE responses (
            id TEXT PRIMARY KEY,
            client_id TEXT NOT NULL REFERENCES clients(id),
            model TEXT NOT NULL,
            model_digest TEXT,
            created_at BIGINT NOT NULL,
            request TEXT NOT NULL,
            background BIGINT NOT NULL,
            store BIGINT NOT NULL,
            usage TEXT,
            incomplete_reason TEXT,
            output TEXT,
            previous_id TEXT
        );
        CREATE INDEX responses_previous ON responses(previous_id) WHERE previous_id IS NOT NULL;
        CREATE TABLE tasks (
            seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            id TEXT NOT NULL UNIQUE,
            response_id TEXT NOT NULL UNIQUE REFERENCES responses(id) ON DELETE CASCADE,
            client_id TEXT NOT NULL REFERENCES clients(id),
            status TEXT NOT NULL CHECK (status IN
                ('queued','loading','running','cancelling','completed','failed','cancelled')),
            on_restart TEXT NOT NULL CHECK (on_restart IN ('fail','retry','resume')),
            attempt BIGINT NOT NULL DEFAULT 1,
            last_sequence_number BIGINT NOT NULL,
            created_at BIGINT NOT NULL,
            updated_at BIGINT NOT NULL,
            finished_at BIGINT,
            error_code TEXT,
            error_message TEXT,
            snapshot TEXT
        );
        CREATE INDEX tasks_status ON tasks(status, seq);
        CREATE INDEX tasks_client ON tasks(client_id, seq);
        CREATE INDEX tasks_finished ON tasks(finished_at) WHERE finished_at IS NOT NULL;
        CREATE TABLE task_events (
            task_id TEXT NOT NULL REFERENCES tasks(id) ON DELETE CASCADE,
            sequence_number BIGINT NOT NULL,
            type TEXT NOT NULL,
            data TEXT NOT NULL,
            created_at BIGINT NOT NULL,
            PRIMARY KEY (task_id, sequence_number)
        );
        CREATE TABLE idempotency_keys (
            client_id TEXT NOT NULL REFERENCES clients(id),
            key TEXT NOT NULL,
            request_digest TEXT NOT NULL,
            status_code BIGINT NOT NULL,
            resource_id TEXT,
            created_at BIGINT NOT NULL,
            expires_at BIGINT NOT NULL,
            PRIMARY KEY (client_id, key)
        );
        CREATE INDEX idempotency_expiry ON idempotency_keys(expires_at);
        CREATE TABLE pairing_requests (
            id TEXT PRIMARY KEY,
            user_code TEXT NOT NULL UNIQUE,
            client_name TEXT NOT NULL,
            scopes TEXT NOT NULL,
            status TEXT NOT NULL CHECK (status IN ('pending','approved','denied','claimed')),
            granted_scopes TEXT,
            client_id TEXT REFERENCES clients(id),
            created_at BIGINT NOT NULL,
            expires_at BIGINT NOT NULL,
            decided_at BIGINT,
            claimed_at BIGINT,
            source TEXT NOT NULL DEFAULT ''
        );
        CREATE INDEX pairing_expiry ON pairing_requests(expires_at);
        CREATE INDEX pairing_source ON pairing_requests(source, status);
        CREATE TABLE task_tokens (
            task_id TEXT NOT NULL REFERENCES tasks(id) ON DELETE CASCADE,
            start BIGINT NOT NULL,
            tokens BYTEA NOT NULL,
            PRIMARY KEY (task_id, start)
        );

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
        """,
    ),
    (
        "p009_nodes",
        """
        ALTER TABLE tasks ADD COLUMN node_id TEXT;
        ALTER TABLE tasks ADD COLUMN lease_epoch BIGINT NOT NULL DEFAULT 0;
        CREATE INDEX tasks_node ON tasks(node_id) WHERE node_id IS NOT NULL;
        CREATE TABLE nodes (
            id TEXT PRIMARY KEY,
            epoch BIGINT NOT NULL,
            address TEXT NOT NULL,
            started_at DOUBLE PRECISION NOT NULL,
            heartbeat_at DOUBLE PRECISION NOT NULL,
            lease_expires_at DOUBLE PRECISION NOT NULL,
            status TEXT NOT NULL CHECK (status IN ('up','left','lost'))
        );
        """,
    ),
    (
        "p010_node_clock",
        """
        ALTER TABLE nodes ADD COLUMN clock_skew DOUBLE PRECISION;
        """,
    ),
    (
        "p011_model_aliases",
        """
        CREATE TABLE model_aliases (
            alias TEXT PRIMARY KEY,
            model TEXT NOT NULL,
            created_at BIGINT NOT NULL
        );
        """,
    ),
    (
        "p012_webhooks",
        """
        CREATE TABLE webhooks (
            id TEXT PRIMARY KEY,
            client_id TEXT NOT NULL REFERENCES clients(id),
            url TEXT NOT NULL,
            events TEXT NOT NULL,
            description TEXT,
            all_clients BIGINT NOT NULL DEFAULT 0,
            secret TEXT NOT NULL,
            created_at BIGINT NOT NULL
        );
        CREATE INDEX webhooks_client ON webhooks(client_id);
        CREATE INDEX webhooks_all ON webhooks(all_clients) WHERE all_clients = 1;
        CREATE TABLE webhook_deliveries (
            seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            event_id TEXT NOT NULL,
            webhook_id TEXT NOT NULL REFERENCES webhooks(id) ON DELETE CASCADE,
            type TEXT NOT NULL,
            response_id TEXT NOT NULL,
            client_id TEXT NOT NULL,
            created_at DOUBLE PRECISION NOT NULL,
            status TEXT NOT NULL CHECK (status IN ('pending','delivered','failed')),
            attempts BIGINT NOT NULL DEFAULT 0,
            next_attempt_at DOUBLE PRECISION NOT NULL,
            claim TEXT,
            claimed_by TEXT,
            last_attempt_at DOUBLE PRECISION,
            last_status BIGINT,
            last_error TEXT,
            delivered_at DOUBLE PRECISION,
            UNIQUE (webhook_id, event_id)
        );
        CREATE INDEX webhook_deliveries_due ON webhook_deliveries(next_attempt_at)
            WHERE status = 'pending';
        CREATE INDEX webhook_deliveries_done ON webhook_deliveries(last_attempt_at)
            WHERE status != 'pending';
        CREATE INDEX webhook_deliveries_of ON webhook_deliveries(webhook_id, seq);
        """,
    ),
    (
        "p013_conversations",
        """
        CREATE TABLE conversations (
            id TEXT PRIMARY KEY,
            client_id TEXT NOT NULL REFERENCES clients(id),
            created_at BIGINT NOT NULL,
            updated_at BIGINT NOT NULL,
            metadata TEXT NOT NULL
        );
        CREATE INDEX conversations_client ON conversations(client_id);
        CREATE TABLE conversation_items (
            seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            conversation_id TEXT NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
            id TEXT NOT NULL,
            item TEXT NOT NULL,
            response_id TEXT,
            created_at BIGINT NOT NULL
        );
        CREATE UNIQUE INDEX conversation_items_id ON conversation_items(conversation_id, id);
        CREATE INDEX conversation_items_order ON conversation_items(conversation_id, seq);
        ALTER TABLE responses ADD COLUMN conversation_id TEXT;
        """,
    ),
    (
        "p014_model_pulls",
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
            total_bytes BIGINT NOT NULL,
            part BIGINT NOT NULL DEFAULT 0,
            part_bytes BIGINT NOT NULL DEFAULT 0,
            bytes_done BIGINT NOT NULL DEFAULT 0,
            created_at BIGINT NOT NULL
        );
        CREATE INDEX model_pulls_ref ON model_pulls(ref, model_id);
        """,
    ),
    (
        "p015_mcp_headers",
        """
        CREATE TABLE mcp_headers (
            response_id TEXT PRIMARY KEY REFERENCES responses(id) ON DELETE CASCADE,
            headers TEXT NOT NULL
        );
        """,
    ),
    (
        "p016_fair_share",
        """
        ALTER TABLE clients ADD COLUMN max_queued BIGINT;
        ALTER TABLE clients ADD COLUMN max_running BIGINT;
        ALTER TABLE clients ADD COLUMN tokens_per_minute BIGINT;
        ALTER TABLE clients ADD COLUMN tokens_per_day BIGINT;
        ALTER TABLE clients ADD COLUMN served BIGINT NOT NULL DEFAULT 0;
        ALTER TABLE tasks ADD COLUMN tier BIGINT NOT NULL DEFAULT 1;
        CREATE INDEX tasks_client_status ON tasks(client_id, status);
        CREATE INDEX tasks_queue ON tasks(status, tier, client_id, seq);
        CREATE TABLE usage_daily (
            client_id TEXT NOT NULL,
            model TEXT NOT NULL,
            day TEXT NOT NULL,
            requests BIGINT NOT NULL,
            input_tokens BIGINT NOT NULL,
            cached_tokens BIGINT NOT NULL,
            output_tokens BIGINT NOT NULL,
            PRIMARY KEY (client_id, model, day)
        );
        CREATE INDEX usage_day ON usage_daily(day);
        CREATE TABLE usage_minutes (
            client_id TEXT NOT NULL,
            minute BIGINT NOT NULL,
            tokens BIGINT NOT NULL,
            PRIMARY KEY (client_id, minute)
        );
        CREATE TABLE audit_log (
            id BIGINT PRIMARY KEY,
            at BIGINT NOT NULL,
            actor TEXT NOT NULL,
            action TEXT NOT NULL,
            target TEXT NOT NULL,
            change TEXT NOT NULL,
            prev_hash TEXT NOT NULL,
            hash TEXT NOT NULL
        );
        CREATE FUNCTION lmsp_audit_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            RAISE EXCEPTION 'the audit log is append-only';
        END $$;
        CREATE TRIGGER lmsp_audit_append_only BEFORE UPDATE OR DELETE ON audit_log
            FOR EACH ROW EXECUTE FUNCTION lmsp_audit_append_only();
        """,
    ),
    (
        "p017_webhook_updated_at",
        """
        ALTER TABLE webhooks ADD COLUMN updated_at BIGINT;
        UPDATE webhooks SET updated_at = created_at;
        """,
    ),
    (
        "p018_conversation_sizes",
        """
        ALTER TABLE conversations ADD COLUMN item_count BIGINT NOT NULL DEFAULT 0;
        ALTER TABLE conversations ADD COLUMN item_bytes BIGINT NOT NULL DEFAULT 0;
        UPDATE conversations SET
            item_count = (SELECT COUNT(*) FROM conversation_items i
                          WHERE i.conversation_id = conversations.id),
            item_bytes = (SELECT COALESCE(SUM(octet_length(i.item)), 0)
                          FROM conversation_items i WHERE i.conversation_id = conversations.id);
        CREATE INDEX conversations_updated ON conversations(updated_at);
        CREATE INDEX responses_conversation ON responses(conversation_id)
            WHERE conversation_id IS NOT NULL;
        """,
    ),
]


def migrate(raw: Any) -> list[str]:
    """Apply every migration not yet recorded on a psycopg connection in autocommit
    mode; return the names applied now."""
    done: list[str] = []
    for name, sql in MIGRATIONS:
        with raw.transaction():
            raw.execute("SELECT pg_advisory_xact_lock(%s)", (LOCK_ID,))
            raw.execute(
                "CREATE TABLE IF NOT EXISTS _migrations ("
                " name TEXT PRIMARY KEY, applied_at BIGINT NOT NULL)"
            )
            if raw.execute("SELECT 1 FROM _migrations WHERE name = %s", (name,)).fetchone():
                continue
            raw.execute(sql)
            raw.execute(
                "INSERT INTO _migrations (name, applied_at) VALUES (%s, %s)",
                (name, int(time.time())),
            )
        done.append(name)
    return done
