"""Suite-wide setting: no local cluster a test starts takes 127.0.0.1:9876.

``raftmq cluster up`` and ``raftmq up`` put the name server on RocketMQ's port 9876 when
it is free; the suite must never hold it, so that a developer's own cluster (or the one
test that asserts the default, ``tests/cluster/test_default_namesrv.py``) is not disturbed.
``RAFTMQ_NAMESRV_PORT=0`` (any free port) is inherited by every process a test starts.
"""

from __future__ import annotations

import os

os.environ["RAFTMQ_NAMESRV_PORT"] = "0"
