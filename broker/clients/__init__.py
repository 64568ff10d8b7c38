"""Who is connected to this replica (not replicated): the consumer and producer groups
registered by each connection (``registry``) and how many group topics their heartbeats
and send-backs may make a leader create (``retry_topics``)."""
