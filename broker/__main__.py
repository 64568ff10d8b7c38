"""``python -m broker``: run one broker replica (see broker.node)."""

import sys

from broker.node import main

sys.exit(main())
