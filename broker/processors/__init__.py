"""One processor per request family (RocketMQ's processor per request code group): send, pull,
query, topic, offset, consumer, deferred, acl; ``base`` is their common base, and the
connection-side tables they keep (parked long polls, connected clients, retry-topic quotas)."""
