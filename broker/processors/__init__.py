"""One processor per request family (RocketMQ's processor per request code group): send, pull,
query, topic, offset, consumer, deferred, acl; ``base`` is their common base, ``context`` the
``BrokerContext`` they see, ``outcomes`` their answers, ``long_polls`` the parked pulls."""
