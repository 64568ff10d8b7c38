"""The broker's HTTP endpoints on the client port: the admin API, ``/metrics``, the members
admin API and ``raftmq cluster verify``'s endpoint."""
