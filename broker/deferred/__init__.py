"""Messages delivered later (their replicated held tables are ``broker.state.held``): the
leader's service that holds and releases them, carrying held messages forward past
retention, and the overdue watch."""
