"""Messages delivered later: the replicated held tables (``held``), the leader's service that
holds and releases them, carrying held messages forward past retention, and the overdue watch."""
