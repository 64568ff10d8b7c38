"""The stateless name server (``python -m broker.namesrv.server``, ``raftmq namesrv``): its
HTTP server, its TOML, and its route table. It imports neither the broker's storage nor
dledger's Raft (tests/unit/test_layering.py)."""
