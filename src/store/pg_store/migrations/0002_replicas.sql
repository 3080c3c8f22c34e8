-- antler's PostgreSQL schema, version 2: several replicas on one database.
--
-- Each replica marks itself alive until `expires_at_ms` (the database's clock, so replicas'
-- clocks need not agree) and renews the mark; a conversation's turns and replies run on the
-- replica holding it while that replica's mark is alive. A mark is only ever extended by its
-- own replica, never brought back once it ran out: a replica that finds its mark gone stops.

CREATE TABLE antler_replicas (
    owner text COLLATE "C" PRIMARY KEY,
    expires_at_ms bigint NOT NULL
);

CREATE TABLE antler_conversation_owners (
    conversation text COLLATE "C" PRIMARY KEY,
    owner text COLLATE "C" NOT NULL
);
CREATE INDEX antler_conversation_owners_owner ON antler_conversation_owners (owner);

-- Pending replies by conversation, for adopting a dead replica's conversations.
CREATE INDEX antler_outbox_pending_conversation ON antler_outbox (conversation, seq)
    WHERE status = 'pending';

-- The replica running a task: a task whose replica is gone is failed, once, by whichever
-- replica finds it (NULL: written before replicas, or by a store copy).
ALTER TABLE antler_subagents ADD COLUMN owner text COLLATE "C";

-- The id every replica expects in `[store] path` (file `.antler-store-id`): thread folders
-- and the audit log are files, so replicas must share one folder; a replica whose folder
-- holds another id (or none, once the database names one) is not on the shared volume.
CREATE TABLE antler_folder (
    one boolean PRIMARY KEY DEFAULT true CHECK (one),
    id text NOT NULL
);
