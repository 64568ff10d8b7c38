"""Apache RocketMQ 4.9.x's remoting protocol, so its Java and Go clients and mqadmin can talk
to RaftMQ (issue 27): ``frame`` (framing, JSON and ROCKETMQ headers), ``codes``,
``headers`` (typed extFields), ``message`` (stored and batch messages, message ids),
``bodies`` (routes, cluster info, heartbeats, locks) and ``fastjson`` (fastjson's JSON).
Imports nothing of ours outside ``protocol``; golden bytes from the real 4.9.7 classes are
under tests/compat/golden/encoded (tests/unit/test_rocketmq_codec.py).
"""
