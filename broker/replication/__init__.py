"""The leader's write path into the Raft log and the replicas' checks of each other: divergence
digests and the comparison of verify-marker digests (the apply step takes those:
``broker.state.marker_digest``)."""
