-- antler's PostgreSQL schema, version 1: one table per collection of the store.
--
-- Columns hold what queries filter and sort on (sequence numbers, conversation keys, statuses,
-- due and finish times); the record itself is the store's own binary record (`records.rs`) in
-- `bytea` where sled keeps one, else the JSON sled keeps, as `jsonb`. Keys that pages and lists
-- are sorted by are `COLLATE "C"`, so they sort bytewise as on sled.
--
-- Rows that one replica claims from another later (inbox, outbox, memory queue) carry their
-- conversation or user, so a claim can lock them per conversation (`FOR UPDATE SKIP LOCKED`).

-- Counts read by /readyz and metrics (the sum of the rows), changed in the transactions that
-- change what they count. A transaction changes the row of its connection's shard, so
-- concurrent writers do not all wait for one row's lock.
CREATE TABLE antler_counters (
    shard smallint PRIMARY KEY CHECK (shard >= 0 AND shard < 16),
    inbox bigint NOT NULL,
    outbox_pending bigint NOT NULL
);
INSERT INTO antler_counters (shard, inbox, outbox_pending)
    SELECT shard, 0, 0 FROM generate_series(0, 15) AS shard;

CREATE TABLE antler_conversations (
    key text COLLATE "C" PRIMARY KEY,
    thread_id text NOT NULL,
    record jsonb NOT NULL
);

-- Thread metadata; its messages are rows of antler_messages.
CREATE TABLE antler_threads (
    id text COLLATE "C" PRIMARY KEY,
    conversation text COLLATE "C" NOT NULL,
    updated_at_ms bigint NOT NULL,
    meta jsonb NOT NULL
);
CREATE INDEX antler_threads_conversation ON antler_threads (conversation);

CREATE TABLE antler_messages (
    thread_id text COLLATE "C" NOT NULL,
    position bigint NOT NULL,
    record bytea NOT NULL,
    PRIMARY KEY (thread_id, position)
);

-- Inbox numbers; an outbox key is an inbox number times 2^16 plus the reply's index, so
-- they stop where that would leave bigint.
CREATE SEQUENCE antler_inbox_seq AS bigint MINVALUE 1 MAXVALUE 140737488355327;

CREATE TABLE antler_inbox (
    seq bigint PRIMARY KEY,
    conversation text COLLATE "C" NOT NULL,
    thread_id text NOT NULL,
    status text NOT NULL,
    accepted_at_ms bigint NOT NULL,
    record bytea NOT NULL
);
CREATE INDEX antler_inbox_conversation ON antler_inbox (conversation, seq);

-- Event ids seen per conversation, until they expire.
CREATE TABLE antler_dedupe (
    conversation text COLLATE "C" NOT NULL,
    event_id text COLLATE "C" NOT NULL,
    expires_at_ms bigint NOT NULL,
    thread_id text NOT NULL,
    seq bigint,
    PRIMARY KEY (conversation, event_id)
);
CREATE INDEX antler_dedupe_expiry ON antler_dedupe (expires_at_ms);

CREATE TABLE antler_outbox (
    seq bigint PRIMARY KEY,
    inbox_seq bigint NOT NULL,
    conversation text COLLATE "C" NOT NULL,
    status text NOT NULL,
    created_at_ms bigint NOT NULL,
    finished_at_ms bigint,
    record bytea NOT NULL
);
CREATE INDEX antler_outbox_pending ON antler_outbox (seq) WHERE status = 'pending';
CREATE INDEX antler_outbox_finished ON antler_outbox (finished_at_ms) WHERE status <> 'pending';

CREATE TABLE antler_memory (
    user_key text COLLATE "C" PRIMARY KEY,
    document jsonb NOT NULL
);

CREATE TABLE antler_memory_queue (
    user_id text COLLATE "C" NOT NULL,
    thread_id text COLLATE "C" NOT NULL,
    enqueued_at_ms bigint NOT NULL,
    due_at_ms bigint NOT NULL,
    record jsonb NOT NULL,
    PRIMARY KEY (user_id, thread_id)
);
CREATE INDEX antler_memory_queue_due ON antler_memory_queue (due_at_ms);

CREATE TABLE antler_subagents (
    id text COLLATE "C" PRIMARY KEY,
    parent_thread_id text COLLATE "C" NOT NULL,
    status text NOT NULL,
    terminal boolean NOT NULL,
    created_at_ms bigint NOT NULL,
    finished_at_ms bigint,
    record jsonb NOT NULL
);
CREATE INDEX antler_subagents_unfinished ON antler_subagents (id) WHERE NOT terminal;

-- Which task a turn's tool call started (a later task of the same call replaces it).
CREATE TABLE antler_subagent_calls (
    thread_id text COLLATE "C" NOT NULL,
    turn bigint NOT NULL,
    call_id text COLLATE "C" NOT NULL,
    subagent_id text COLLATE "C" NOT NULL,
    PRIMARY KEY (thread_id, turn, call_id)
);
CREATE INDEX antler_subagent_calls_subagent ON antler_subagent_calls (subagent_id);

-- Leases by name: `store` is the store-wide one.
CREATE TABLE antler_leases (
    name text COLLATE "C" PRIMARY KEY,
    owner text NOT NULL,
    until_ms bigint NOT NULL,
    released boolean NOT NULL
);

CREATE TABLE antler_skills (
    name text COLLATE "C" PRIMARY KEY,
    enabled boolean NOT NULL
);

CREATE TABLE antler_pairing_requests (
    channel text COLLATE "C" NOT NULL,
    user_id text COLLATE "C" NOT NULL,
    record jsonb NOT NULL,
    PRIMARY KEY (channel, user_id)
);

CREATE TABLE antler_paired_users (
    channel text COLLATE "C" NOT NULL,
    user_id text COLLATE "C" NOT NULL,
    record jsonb NOT NULL,
    PRIMARY KEY (channel, user_id)
);

CREATE TABLE antler_schedules (
    name text COLLATE "C" PRIMARY KEY,
    record jsonb NOT NULL
);

CREATE TABLE antler_schedule_marks (
    name text COLLATE "C" PRIMARY KEY,
    fire_ms bigint NOT NULL
);

CREATE TABLE antler_approvals (
    id text COLLATE "C" PRIMARY KEY,
    conversation text COLLATE "C" NOT NULL,
    thread_id text COLLATE "C" NOT NULL,
    call_key text COLLATE "C" NOT NULL,
    state text NOT NULL,
    queued boolean NOT NULL,
    created_at_ms bigint NOT NULL,
    decided_at_ms bigint,
    record jsonb NOT NULL,
    UNIQUE (thread_id, call_key)
);
CREATE INDEX antler_approvals_pending ON antler_approvals (conversation) WHERE state = 'pending';
CREATE INDEX antler_approvals_open ON antler_approvals (created_at_ms) WHERE NOT queued;
CREATE INDEX antler_approvals_decided ON antler_approvals (decided_at_ms) WHERE queued;
