"""Benchmarks run from a checkout (``python -m benchmarks.NAME``, figures in docs/BENCHMARKS.md);
not installed: the wheel holds only the packages users run (``raftmq bench`` and
``raftmq bench-log`` are CLI commands and stay in raftmq/)."""
