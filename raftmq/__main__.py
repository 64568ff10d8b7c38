"""``python -m raftmq``: the ``raftmq`` command line."""

import sys

from raftmq.cli import main

sys.exit(main())
