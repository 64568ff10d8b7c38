"""``python -m dledger``: run one CommitLog replica (see dledger.process.log_node)."""

import sys

from dledger.process.log_node import main

sys.exit(main())
