"""The leader's write path into the Raft log and the replicas' checks of each other: divergence
digests, verify-marker digests and their comparison."""
