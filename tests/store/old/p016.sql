-- A PostgreSQL database as lmsp left it before the paired migration steps: migrated
-- to p016_fair_share by the old pg_schema.py, with a few rows (pg_dump --inserts).
SET statement_timeout = 0;
SET lock_timeout = 0;
SET idle_in_transaction_session_timeout = 0;
SET client_encoding = 'UTF8';
SET standard_conforming_strings = on;
SELECT pg_catalog.set_config('search_path', '', false);
SET check_function_bodies = false;
SET xmloption = content;
SET client_min_messages = warning;
SET row_security = off;
CREATE FUNCTION public.lmsp_audit_append_only() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
        BEGIN
            RAISE EXCEPTION 'the audit log is append-only';
        END $$;
CREATE FUNCTION public.lmsp_clients_changed() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
        BEGIN
            PERFORM pg_notify('lmsp_clients', '');
            RETURN NULL;
        END $$;
CREATE FUNCTION public.lmsp_task_logged() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
        BEGIN
            PERFORM pg_notify('lmsp_tasks', NEW.task_id);
            RETURN NULL;
        END $$;
CREATE FUNCTION public.lmsp_task_row_changed() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
        BEGIN
            IF TG_OP = 'DELETE' THEN
                PERFORM pg_notify('lmsp_tasks', OLD.id || ' deleted');
            ELSE
                PERFORM pg_notify('lmsp_tasks', NEW.id || ' ' || NEW.status);
            END IF;
            RETURN NULL;
        END $$;
SET default_tablespace = '';
SET default_table_access_method = heap;
CREATE TABLE public._migrations (
    name text NOT NULL,
    applied_at bigint NOT NULL
);
CREATE TABLE public.audit_log (
    id bigint NOT NULL,
    at bigint NOT NULL,
    actor text NOT NULL,
    action text NOT NULL,
    target text NOT NULL,
    change text NOT NULL,
    prev_hash text NOT NULL,
    hash text NOT NULL
);
CREATE TABLE public.clients (
    id text NOT NULL,
    name text NOT NULL,
    token_prefix text NOT NULL,
    token_hash text NOT NULL,
    scopes text NOT NULL,
    created_at bigint NOT NULL,
    last_used_at bigint,
    revoked_at bigint,
    max_queued bigint,
    max_running bigint,
    tokens_per_minute bigint,
    tokens_per_day bigint,
    served bigint DEFAULT 0 NOT NULL
);
CREATE TABLE public.conversation_items (
    seq bigint NOT NULL,
    conversation_id text NOT NULL,
    id text NOT NULL,
    item text NOT NULL,
    response_id text,
    created_at bigint NOT NULL
);
ALTER TABLE public.conversation_items ALTER COLUMN seq ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.conversation_items_seq_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);
CREATE TABLE public.conversations (
    id text NOT NULL,
    client_id text NOT NULL,
    created_at bigint NOT NULL,
    updated_at bigint NOT NULL,
    metadata text NOT NULL
);
CREATE TABLE public.idempotency_keys (
    client_id text NOT NULL,
    key text NOT NULL,
    request_digest text NOT NULL,
    status_code bigint NOT NULL,
    resource_id text,
    created_at bigint NOT NULL,
    expires_at bigint NOT NULL
);
CREATE TABLE public.mcp_headers (
    response_id text NOT NULL,
    headers text NOT NULL
);
CREATE TABLE public.model_aliases (
    alias text NOT NULL,
    model text NOT NULL,
    created_at bigint NOT NULL
);
CREATE TABLE public.model_pulls (
    task_id text NOT NULL,
    ref text NOT NULL,
    model_id text NOT NULL,
    node text DEFAULT ''::text NOT NULL,
    repo text NOT NULL,
    revision text NOT NULL,
    quant text NOT NULL,
    files text NOT NULL,
    total_bytes bigint NOT NULL,
    part bigint DEFAULT 0 NOT NULL,
    part_bytes bigint DEFAULT 0 NOT NULL,
    bytes_done bigint DEFAULT 0 NOT NULL,
    created_at bigint NOT NULL
);
CREATE TABLE public.models (
    id text NOT NULL,
    format text NOT NULL,
    engine text NOT NULL,
    digest text NOT NULL,
    size_bytes bigint NOT NULL,
    owned_by text NOT NULL,
    metadata text DEFAULT '{}'::text NOT NULL,
    "position" bigint NOT NULL,
    created_at bigint NOT NULL,
    status text DEFAULT 'ready'::text NOT NULL,
    verified_at bigint,
    defaults text DEFAULT '{}'::text NOT NULL,
    CONSTRAINT models_status_check CHECK ((status = ANY (ARRAY['ready'::text, 'corrupt'::text])))
);
CREATE TABLE public.nodes (
    id text NOT NULL,
    epoch bigint NOT NULL,
    address text NOT NULL,
    started_at double precision NOT NULL,
    heartbeat_at double precision NOT NULL,
    lease_expires_at double precision NOT NULL,
    status text NOT NULL,
    clock_skew double precision,
    CONSTRAINT nodes_status_check CHECK ((status = ANY (ARRAY['up'::text, 'left'::text, 'lost'::text])))
);
CREATE TABLE public.pairing_requests (
    id text NOT NULL,
    user_code text NOT NULL,
    client_name text NOT NULL,
    scopes text NOT NULL,
    status text NOT NULL,
    granted_scopes text,
    client_id text,
    created_at bigint NOT NULL,
    expires_at bigint NOT NULL,
    decided_at bigint,
    claimed_at bigint,
    source text DEFAULT ''::text NOT NULL,
    CONSTRAINT pairing_requests_status_check CHECK ((status = ANY (ARRAY['pending'::text, 'approved'::text, 'denied'::text, 'claimed'::text])))
);
CREATE TABLE public.responses (
    id text NOT NULL,
    client_id text NOT NULL,
    model text NOT NULL,
    model_digest text,
    created_at bigint NOT NULL,
    request text NOT NULL,
    background bigint NOT NULL,
    store bigint NOT NULL,
    usage text,
    incomplete_reason text,
    output text,
    previous_id text,
    conversation_id text
);
CREATE TABLE public.service_config (
    key text NOT NULL,
    value text NOT NULL
);
CREATE TABLE public.task_events (
    task_id text NOT NULL,
    sequence_number bigint NOT NULL,
    type text NOT NULL,
    data text NOT NULL,
    created_at bigint NOT NULL
);
CREATE TABLE public.task_tokens (
    task_id text NOT NULL,
    start bigint NOT NULL,
    tokens bytea NOT NULL
);
CREATE TABLE public.tasks (
    seq bigint NOT NULL,
    id text NOT NULL,
    response_id text NOT NULL,
    client_id text NOT NULL,
    status text NOT NULL,
    on_restart text NOT NULL,
    attempt bigint DEFAULT 1 NOT NULL,
    last_sequence_number bigint NOT NULL,
    created_at bigint NOT NULL,
    updated_at bigint NOT NULL,
    finished_at bigint,
    error_code text,
    error_message text,
    snapshot text,
    node_id text,
    lease_epoch bigint DEFAULT 0 NOT NULL,
    tier bigint DEFAULT 1 NOT NULL,
    CONSTRAINT tasks_on_restart_check CHECK ((on_restart = ANY (ARRAY['fail'::text, 'retry'::text, 'resume'::text]))),
    CONSTRAINT tasks_status_check CHECK ((status = ANY (ARRAY['queued'::text, 'loading'::text, 'running'::text, 'cancelling'::text, 'completed'::text, 'failed'::text, 'cancelled'::text])))
);
ALTER TABLE public.tasks ALTER COLUMN seq ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.tasks_seq_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);
CREATE TABLE public.usage_daily (
    client_id text NOT NULL,
    model text NOT NULL,
    day text NOT NULL,
    requests bigint NOT NULL,
    input_tokens bigint NOT NULL,
    cached_tokens bigint NOT NULL,
    output_tokens bigint NOT NULL
);
CREATE TABLE public.usage_minutes (
    client_id text NOT NULL,
    minute bigint NOT NULL,
    tokens bigint NOT NULL
);
CREATE TABLE public.webhook_deliveries (
    seq bigint NOT NULL,
    event_id text NOT NULL,
    webhook_id text NOT NULL,
    type text NOT NULL,
    response_id text NOT NULL,
    client_id text NOT NULL,
    created_at double precision NOT NULL,
    status text NOT NULL,
    attempts bigint DEFAULT 0 NOT NULL,
    next_attempt_at double precision NOT NULL,
    claim text,
    claimed_by text,
    last_attempt_at double precision,
    last_status bigint,
    last_error text,
    delivered_at double precision,
    CONSTRAINT webhook_deliveries_status_check CHECK ((status = ANY (ARRAY['pending'::text, 'delivered'::text, 'failed'::text])))
);
ALTER TABLE public.webhook_deliveries ALTER COLUMN seq ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.webhook_deliveries_seq_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);
CREATE TABLE public.webhooks (
    id text NOT NULL,
    client_id text NOT NULL,
    url text NOT NULL,
    events text NOT NULL,
    description text,
    all_clients bigint DEFAULT 0 NOT NULL,
    secret text NOT NULL,
    created_at bigint NOT NULL
);
INSERT INTO public._migrations VALUES ('p001_schema', 1700000000);
INSERT INTO public._migrations VALUES ('p009_nodes', 1700000000);
INSERT INTO public._migrations VALUES ('p010_node_clock', 1700000000);
INSERT INTO public._migrations VALUES ('p011_model_aliases', 1700000000);
INSERT INTO public._migrations VALUES ('p012_webhooks', 1700000000);
INSERT INTO public._migrations VALUES ('p013_conversations', 1700000000);
INSERT INTO public._migrations VALUES ('p014_model_pulls', 1700000000);
INSERT INTO public._migrations VALUES ('p015_mcp_headers', 1700000000);
INSERT INTO public._migrations VALUES ('p016_fair_share', 1700000000);
INSERT INTO public.audit_log VALUES (1, 1700000000, 'owner', 'client.create', 'cli_owner', '{}', '', 'abc');
INSERT INTO public.clients VALUES ('cli_owner', 'owner', 'lmsp_ab', 'h1', '["admin"]', 1700000000, NULL, NULL, NULL, NULL, NULL, NULL, 0);
INSERT INTO public.conversation_items OVERRIDING SYSTEM VALUE VALUES (1, 'conv_1', 'msg_1', '{"type":"message","role":"user","content":[{"type":"input_text","text":"héllo"}]}', NULL, 1700000200);
INSERT INTO public.conversation_items OVERRIDING SYSTEM VALUE VALUES (2, 'conv_1', 'msg_2', '{"type":"message","role":"assistant","content":[{"type":"output_text","text":"hi"}]}', NULL, 1700000300);
INSERT INTO public.conversations VALUES ('conv_1', 'cli_owner', 1700000200, 1700000300, '{}');
INSERT INTO public.models VALUES ('m1', 'gguf', 'llama_cpp', 'sha256:00', 1234, 'lmsp', '{}', 0, 1700000000, 'ready', NULL, '{}');
INSERT INTO public.responses VALUES ('resp_1', 'cli_owner', 'm1', NULL, 1700000300, '{"model":"m1","input":"hi"}', 1, 1, NULL, NULL, '[]', NULL, 'conv_1');
INSERT INTO public.task_events VALUES ('task_1', 0, 'response.created', '{}', 1700000300);
INSERT INTO public.task_events VALUES ('task_1', 1, 'response.completed', '{}', 1700000301);
INSERT INTO public.tasks OVERRIDING SYSTEM VALUE VALUES (1, 'task_1', 'resp_1', 'cli_owner', 'completed', 'fail', 1, 1, 1700000300, 1700000301, 1700000301, NULL, NULL, NULL, NULL, 0, 1);
INSERT INTO public.usage_daily VALUES ('cli_owner', 'm1', '2023-11-14', 1, 5, 0, 2);
INSERT INTO public.webhooks VALUES ('wh_1', 'cli_owner', 'http://127.0.0.1:9/hook', '["response.completed"]', NULL, 0, 'whsec_x', 1700000100);
SELECT pg_catalog.setval('public.conversation_items_seq_seq', 2, true);
SELECT pg_catalog.setval('public.tasks_seq_seq', 1, true);
SELECT pg_catalog.setval('public.webhook_deliveries_seq_seq', 1, false);
ALTER TABLE ONLY public._migrations
    ADD CONSTRAINT _migrations_pkey PRIMARY KEY (name);
ALTER TABLE ONLY public.audit_log
    ADD CONSTRAINT audit_log_pkey PRIMARY KEY (id);
ALTER TABLE ONLY public.clients
    ADD CONSTRAINT clients_pkey PRIMARY KEY (id);
ALTER TABLE ONLY public.clients
    ADD CONSTRAINT clients_token_hash_key UNIQUE (token_hash);
ALTER TABLE ONLY public.conversation_items
    ADD CONSTRAINT conversation_items_pkey PRIMARY KEY (seq);
ALTER TABLE ONLY public.conversations
    ADD CONSTRAINT conversations_pkey PRIMARY KEY (id);
ALTER TABLE ONLY public.idempotency_keys
    ADD CONSTRAINT idempotency_keys_pkey PRIMARY KEY (client_id, key);
ALTER TABLE ONLY public.mcp_headers
    ADD CONSTRAINT mcp_headers_pkey PRIMARY KEY (response_id);
ALTER TABLE ONLY public.model_aliases
    ADD CONSTRAINT model_aliases_pkey PRIMARY KEY (alias);
ALTER TABLE ONLY public.model_pulls
    ADD CONSTRAINT model_pulls_pkey PRIMARY KEY (task_id);
ALTER TABLE ONLY public.models
    ADD CONSTRAINT models_pkey PRIMARY KEY (id);
ALTER TABLE ONLY public.nodes
    ADD CONSTRAINT nodes_pkey PRIMARY KEY (id);
ALTER TABLE ONLY public.pairing_requests
    ADD CONSTRAINT pairing_requests_pkey PRIMARY KEY (id);
ALTER TABLE ONLY public.pairing_requests
    ADD CONSTRAINT pairing_requests_user_code_key UNIQUE (user_code);
ALTER TABLE ONLY public.responses
    ADD CONSTRAINT responses_pkey PRIMARY KEY (id);
ALTER TABLE ONLY public.service_config
    ADD CONSTRAINT service_config_pkey PRIMARY KEY (key);
ALTER TABLE ONLY public.task_events
    ADD CONSTRAINT task_events_pkey PRIMARY KEY (task_id, sequence_number);
ALTER TABLE ONLY public.task_tokens
    ADD CONSTRAINT task_tokens_pkey PRIMARY KEY (task_id, start);
ALTER TABLE ONLY public.tasks
    ADD CONSTRAINT tasks_id_key UNIQUE (id);
ALTER TABLE ONLY public.tasks
    ADD CONSTRAINT tasks_pkey PRIMARY KEY (seq);
ALTER TABLE ONLY public.tasks
    ADD CONSTRAINT tasks_response_id_key UNIQUE (response_id);
ALTER TABLE ONLY public.usage_daily
    ADD CONSTRAINT usage_daily_pkey PRIMARY KEY (client_id, model, day);
ALTER TABLE ONLY public.usage_minutes
    ADD CONSTRAINT usage_minutes_pkey PRIMARY KEY (client_id, minute);
ALTER TABLE ONLY public.webhook_deliveries
    ADD CONSTRAINT webhook_deliveries_pkey PRIMARY KEY (seq);
ALTER TABLE ONLY public.webhook_deliveries
    ADD CONSTRAINT webhook_deliveries_webhook_id_event_id_key UNIQUE (webhook_id, event_id);
ALTER TABLE ONLY public.webhooks
    ADD CONSTRAINT webhooks_pkey PRIMARY KEY (id);
CREATE UNIQUE INDEX conversation_items_id ON public.conversation_items USING btree (conversation_id, id);
CREATE INDEX conversation_items_order ON public.conversation_items USING btree (conversation_id, seq);
CREATE INDEX conversations_client ON public.conversations USING btree (client_id);
CREATE INDEX idempotency_expiry ON public.idempotency_keys USING btree (expires_at);
CREATE INDEX model_pulls_ref ON public.model_pulls USING btree (ref, model_id);
CREATE INDEX pairing_expiry ON public.pairing_requests USING btree (expires_at);
CREATE INDEX pairing_source ON public.pairing_requests USING btree (source, status);
CREATE INDEX responses_previous ON public.responses USING btree (previous_id) WHERE (previous_id IS NOT NULL);
CREATE INDEX tasks_client ON public.tasks USING btree (client_id, seq);
CREATE INDEX tasks_client_status ON public.tasks USING btree (client_id, status);
CREATE INDEX tasks_finished ON public.tasks USING btree (finished_at) WHERE (finished_at IS NOT NULL);
CREATE INDEX tasks_node ON public.tasks USING btree (node_id) WHERE (node_id IS NOT NULL);
CREATE INDEX tasks_queue ON public.tasks USING btree (status, tier, client_id, seq);
CREATE INDEX tasks_status ON public.tasks USING btree (status, seq);
CREATE INDEX usage_day ON public.usage_daily USING btree (day);
CREATE INDEX webhook_deliveries_done ON public.webhook_deliveries USING btree (last_attempt_at) WHERE (status <> 'pending'::text);
CREATE INDEX webhook_deliveries_due ON public.webhook_deliveries USING btree (next_attempt_at) WHERE (status = 'pending'::text);
CREATE INDEX webhook_deliveries_of ON public.webhook_deliveries USING btree (webhook_id, seq);
CREATE INDEX webhooks_all ON public.webhooks USING btree (all_clients) WHERE (all_clients = 1);
CREATE INDEX webhooks_client ON public.webhooks USING btree (client_id);
CREATE TRIGGER lmsp_audit_append_only BEFORE DELETE OR UPDATE ON public.audit_log FOR EACH ROW EXECUTE FUNCTION public.lmsp_audit_append_only();
CREATE TRIGGER lmsp_watch_clients AFTER INSERT OR DELETE OR UPDATE OF token_prefix, token_hash, scopes, name, revoked_at ON public.clients FOR EACH STATEMENT EXECUTE FUNCTION public.lmsp_clients_changed();
CREATE TRIGGER lmsp_watch_task_events AFTER INSERT ON public.task_events FOR EACH ROW EXECUTE FUNCTION public.lmsp_task_logged();
CREATE TRIGGER lmsp_watch_tasks AFTER DELETE OR UPDATE ON public.tasks FOR EACH ROW EXECUTE FUNCTION public.lmsp_task_row_changed();
ALTER TABLE ONLY public.conversation_items
    ADD CONSTRAINT conversation_items_conversation_id_fkey FOREIGN KEY (conversation_id) REFERENCES public.conversations(id) ON DELETE CASCADE;
ALTER TABLE ONLY public.conversations
    ADD CONSTRAINT conversations_client_id_fkey FOREIGN KEY (client_id) REFERENCES public.clients(id);
ALTER TABLE ONLY public.idempotency_keys
    ADD CONSTRAINT idempotency_keys_client_id_fkey FOREIGN KEY (client_id) REFERENCES public.clients(id);
ALTER TABLE ONLY public.mcp_headers
    ADD CONSTRAINT mcp_headers_response_id_fkey FOREIGN KEY (response_id) REFERENCES public.responses(id) ON DELETE CASCADE;
ALTER TABLE ONLY public.model_pulls
    ADD CONSTRAINT model_pulls_task_id_fkey FOREIGN KEY (task_id) REFERENCES public.tasks(id) ON DELETE CASCADE;
ALTER TABLE ONLY public.pairing_requests
    ADD CONSTRAINT pairing_requests_client_id_fkey FOREIGN KEY (client_id) REFERENCES public.clients(id);
ALTER TABLE ONLY public.responses
    ADD CONSTRAINT responses_client_id_fkey FOREIGN KEY (client_id) REFERENCES public.clients(id);
ALTER TABLE ONLY public.task_events
    ADD CONSTRAINT task_events_task_id_fkey FOREIGN KEY (task_id) REFERENCES public.tasks(id) ON DELETE CASCADE;
ALTER TABLE ONLY public.task_tokens
    ADD CONSTRAINT task_tokens_task_id_fkey FOREIGN KEY (task_id) REFERENCES public.tasks(id) ON DELETE CASCADE;
ALTER TABLE ONLY public.tasks
    ADD CONSTRAINT tasks_client_id_fkey FOREIGN KEY (client_id) REFERENCES public.clients(id);
ALTER TABLE ONLY public.tasks
    ADD CONSTRAINT tasks_response_id_fkey FOREIGN KEY (response_id) REFERENCES public.responses(id) ON DELETE CASCADE;
ALTER TABLE ONLY public.webhook_deliveries
    ADD CONSTRAINT webhook_deliveries_webhook_id_fkey FOREIGN KEY (webhook_id) REFERENCES public.webhooks(id) ON DELETE CASCADE;
ALTER TABLE ONLY public.webhooks
    ADD CONSTRAINT webhooks_client_id_fkey FOREIGN KEY (client_id) REFERENCES public.clients(id);
