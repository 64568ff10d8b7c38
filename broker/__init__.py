"""RaftMQ broker package."""
