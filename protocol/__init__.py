"""What RaftMQ's clients and brokers share: the wire frame and its request and response
codes (``remoting``), one typed class per request and per response body (``wire`` and a
module per family: ``send``, ``pull``, ``query``, ``topic``, ``offset``, ``consumer``,
``deferred``, ``pop``; which class for which code: ``catalog``), the stored message format
(``message_format``), name rules (``names``), tag hashing (``tags``) and the SQL92 filter
(``sql_filter``).

It imports nothing else of RaftMQ: ``broker``, ``client`` and ``spark`` depend on it,
never it on them (``tests/unit/test_layering.py``); outside it, no code spells a wire key
or builds a frame's contents by hand (``tests/unit/test_wire_keys.py``).
"""
