"""The top layer: the ``raftmq`` command line and the tools that start local clusters
(benchmarks, ``raftmq up``). It may import every package; none imports it."""
