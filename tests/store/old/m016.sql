-- A SQLite database as lmsp left it before the paired migration steps: migrated to
-- m016_fair_share by the old migrations.py, with a few rows (sqlite3 iterdump).
BEGIN TRANSACTION;
CREATE TABLE _migrations ( name TEXT PRIMARY KEY, applied_at INTEGER NOT NULL) STRICT;
INSERT INTO "_migrations" VALUES('m001_initial',1700000000);
INSERT INTO "_migrations" VALUES('m002_pairing',1700000000);
INSERT INTO "_migrations" VALUES('m003_model_state',1700000000);
INSERT INTO "_migrations" VALUES('m004_output_items',1700000000);
INSERT INTO "_migrations" VALUES('m005_pairing_source',1700000000);
INSERT INTO "_migrations" VALUES('m006_model_defaults',1700000000);
INSERT INTO "_migrations" VALUES('m007_snapshot_tokens',1700000000);
INSERT INTO "_migrations" VALUES('m008_history_by_reference',1700000000);
INSERT INTO "_migrations" VALUES('m009_nodes',1700000000);
INSERT INTO "_migrations" VALUES('m010_node_clock',1700000000);
INSERT INTO "_migrations" VALUES('m011_model_aliases',1700000000);
INSERT INTO "_migrations" VALUES('m012_webhooks',1700000000);
INSERT INTO "_migrations" VALUES('m013_conversations',1700000000);
INSERT INTO "_migrations" VALUES('m014_model_pulls',1700000000);
INSERT INTO "_migrations" VALUES('m015_mcp_headers',1700000000);
INSERT INTO "_migrations" VALUES('m016_fair_share',1700000000);
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
INSERT INTO "audit_log" VALUES(1,1700000000,'owner','client.create','cli_owner','{}','','abc');
CREATE TABLE clients (
            id TEXT PRIMARY KEY,
            name TEXT NOT NULL,
            token_prefix TEXT NOT NULL,
            token_hash TEXT NOT NULL UNIQUE,
            scopes TEXT NOT NULL,
            created_at INTEGER NOT NULL,
            last_used_at INTEGER,
            revoked_at INTEGER
        , max_queued INTEGER, max_running INTEGER, tokens_per_minute INTEGER, tokens_per_day INTEGER, served INTEGER NOT NULL DEFAULT 0) STRICT;
INSERT INTO "clients" VALUES('cli_owner','owner','lmsp_ab','h1','["admin"]',1700000000,NULL,NULL,NULL,NULL,NULL,NULL,0);
CREATE TABLE conversation_items (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            conversation_id TEXT NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
            id TEXT NOT NULL,
            item TEXT NOT NULL,
            response_id TEXT,
            created_at INTEGER NOT NULL
        ) STRICT;
INSERT INTO "conversation_items" VALUES(1,'conv_1','msg_1','{"type":"message","role":"user","content":[{"type":"input_text","text":"héllo"}]}',NULL,1700000200);
INSERT INTO "conversation_items" VALUES(2,'conv_1','msg_2','{"type":"message","role":"assistant","content":[{"type":"output_text","text":"hi"}]}',NULL,1700000300);
CREATE TABLE conversations (
            id TEXT PRIMARY KEY,
            client_id TEXT NOT NULL REFERENCES clients(id),
            created_at INTEGER NOT NULL,
            updated_at INTEGER NOT NULL,
            metadata TEXT NOT NULL
        ) STRICT;
INSERT INTO "conversations" VALUES('conv_1','cli_owner',1700000200,1700000300,'{}');
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
CREATE TABLE mcp_headers (
            response_id TEXT PRIMARY KEY REFERENCES responses(id) ON DELETE CASCADE,
            headers TEXT NOT NULL
        ) STRICT;
CREATE TABLE model_aliases (
            alias TEXT PRIMARY KEY,
            model TEXT NOT NULL,
            created_at INTEGER NOT NULL
        ) STRICT;
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
        , status TEXT NOT NULL DEFAULT 'ready'
            CHECK (status IN ('ready','corrupt')), verified_at INTEGER, defaults TEXT NOT NULL DEFAULT '{}') STRICT;
INSERT INTO "models" VALUES('m1','gguf','llama_cpp','sha256:00',1234,'lmsp','{}',0,1700000000,'ready',NULL,'{}');
CREATE TABLE nodes (
            id TEXT PRIMARY KEY,
            epoch INTEGER NOT NULL,
            address TEXT NOT NULL,
            started_at REAL NOT NULL,
            heartbeat_at REAL NOT NULL,
            lease_expires_at REAL NOT NULL,
            status TEXT NOT NULL CHECK (status IN ('up','left','lost'))
        , clock_skew REAL) STRICT;
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
        , source TEXT NOT NULL DEFAULT '') STRICT;
CREATE TABLE responses (
            id TEXT PRIMARY KEY,
            client_id TEXT NOT NULL REFERENCES clients(id),
            model TEXT NOT NULL,
            model_digest TEXT,
            created_at INTEGER NOT NULL,
            request TEXT NOT NULL,
            background INTEGER NOT NULL,
            store INTEGER NOT NULL,
            usage TEXT,
            incomplete_reason TEXT
        , output TEXT, previous_id TEXT, conversation_id TEXT) STRICT;
INSERT INTO "responses" VALUES('resp_1','cli_owner','m1',NULL,1700000300,'{"model":"m1","input":"hi"}',1,1,NULL,NULL,'[]',NULL,'conv_1');
CREATE TABLE service_config (
            key TEXT PRIMARY KEY,
            value TEXT NOT NULL
        ) STRICT;
CREATE TABLE task_events (
            task_id TEXT NOT NULL REFERENCES tasks(id) ON DELETE CASCADE,
            sequence_number INTEGER NOT NULL,
            type TEXT NOT NULL,
            data TEXT NOT NULL,
            created_at INTEGER NOT NULL,
            PRIMARY KEY (task_id, sequence_number)
        ) STRICT, WITHOUT ROWID;
INSERT INTO "task_events" VALUES('task_1',0,'response.created','{}',1700000300);
INSERT INTO "task_events" VALUES('task_1',1,'response.completed','{}',1700000301);
CREATE TABLE task_tokens (
            task_id TEXT NOT NULL REFERENCES tasks(id) ON DELETE CASCADE,
            start INTEGER NOT NULL,
            tokens BLOB NOT NULL,
            PRIMARY KEY (task_id, start)
        ) STRICT, WITHOUT ROWID;
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
        , node_id TEXT, lease_epoch INTEGER NOT NULL DEFAULT 0, tier INTEGER NOT NULL DEFAULT 1) STRICT;
INSERT INTO "tasks" VALUES(1,'task_1','resp_1','cli_owner','completed','fail',1,1,1700000300,1700000301,1700000301,NULL,NULL,NULL,NULL,0,1);
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
INSERT INTO "usage_daily" VALUES('cli_owner','m1','2023-11-14',1,5,0,2);
CREATE TABLE usage_minutes (
            client_id TEXT NOT NULL,
            minute INTEGER NOT NULL,
            tokens INTEGER NOT NULL,
            PRIMARY KEY (client_id, minute)
        ) STRICT, WITHOUT ROWID;
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
INSERT INTO "webhooks" VALUES('wh_1','cli_owner','http://127.0.0.1:9/hook','["response.completed"]',NULL,0,'whsec_x',1700000100);
CREATE INDEX tasks_status ON tasks(status, seq);
CREATE INDEX tasks_client ON tasks(client_id, seq);
CREATE INDEX tasks_finished ON tasks(finished_at) WHERE finished_at IS NOT NULL;
CREATE INDEX idempotency_expiry ON idempotency_keys(expires_at);
CREATE INDEX pairing_expiry ON pairing_requests(expires_at);
CREATE INDEX pairing_source ON pairing_requests(source, status);
CREATE INDEX responses_previous ON responses(previous_id) WHERE previous_id IS NOT NULL;
CREATE INDEX tasks_node ON tasks(node_id) WHERE node_id IS NOT NULL;
CREATE INDEX webhooks_client ON webhooks(client_id);
CREATE INDEX webhooks_all ON webhooks(all_clients) WHERE all_clients = 1;
CREATE INDEX webhook_deliveries_due ON webhook_deliveries(next_attempt_at)
            WHERE status = 'pending';
CREATE INDEX webhook_deliveries_done ON webhook_deliveries(last_attempt_at)
            WHERE status != 'pending';
CREATE INDEX webhook_deliveries_of ON webhook_deliveries(webhook_id, seq);
CREATE INDEX conversations_client ON conversations(client_id);
CREATE UNIQUE INDEX conversation_items_id ON conversation_items(conversation_id, id);
CREATE INDEX conversation_items_order ON conversation_items(conversation_id, seq);
CREATE INDEX model_pulls_ref ON model_pulls(ref, model_id);
CREATE INDEX tasks_client_status ON tasks(client_id, status);
CREATE INDEX tasks_queue ON tasks(status, tier, client_id, seq);
CREATE INDEX usage_day ON usage_daily(day);
CREATE TRIGGER audit_log_no_update BEFORE UPDATE ON audit_log
        BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END;
CREATE TRIGGER audit_log_no_delete BEFORE DELETE ON audit_log
        BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END;
DELETE FROM "sqlite_sequence";
INSERT INTO "sqlite_sequence" VALUES('conversation_items',2);
INSERT INTO "sqlite_sequence" VALUES('tasks',1);
COMMIT;
