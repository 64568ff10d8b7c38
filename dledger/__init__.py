"""RaftMQ dledger package."""
