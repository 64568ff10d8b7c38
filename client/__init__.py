"""RaftMQ client package."""
