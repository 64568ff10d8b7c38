"""Utilities every RaftMQ package shares and that import nothing of RaftMQ: strict TOML
reading (``toml_config``), HTTP errors as JSON (``http_errors``), throttled and refusal logs
(``refusal_log``), process plumbing (``process``) and durable small files (``durable_file``)."""
