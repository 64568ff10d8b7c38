"""A replica as a process: the command line every replica process shares and opening its
replica (``replica_args``), and the log node (``python -m dledger``, ``raftmq log-node``): one
ReplicatedLog with ``recording_machine`` as its state machine and an HTTP control API."""
