"""What RaftMQ's clients and brokers share: the wire frame and its request and response
codes (``remoting``), the stored message format (``message_format``), name rules
(``names``), tag hashing (``tags``) and the SQL92 filter (``sql_filter``).

It imports nothing else of RaftMQ: ``broker``, ``client`` and ``spark`` depend on it,
never it on them (``tests/unit/test_layering.py``).
"""
