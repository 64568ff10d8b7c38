"""The CommitLog on disk, knowing nothing of Raft or of a node's role: segment files and their
entry format, scanning and the log-start marker, the Raft term/vote file (``hard_state``),
retention planning, and the disk-full guard. Imports only ``common`` and itself."""
