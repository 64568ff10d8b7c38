"""The pysyncobj adapter: ``ReplicatedLog`` (the ``Log`` API on Raft) and everything that
touches pysyncobj -- the node, journal, wire codec, transport, peer guard and crypto (all of
its patches, installed from ``dledger.raft.patches``), proposals, membership changes,
leadership transfer, pre-vote and candidacy, storage identity, snapshots and retention
across replicas. Only this folder imports pysyncobj (tests/unit/test_layering.py)."""
