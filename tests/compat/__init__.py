# tests/compat: real RocketMQ clients (Java 4.9.7, mqadmin) against RaftMQ's RocketMQ front end.
