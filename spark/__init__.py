"""RaftMQ spark package."""
