"""``raftmq console``: a web console in its own process, talking to a cluster only through
the client (``client.aio``) and the brokers' and name servers' HTTP admin API, as
rocketmq-dashboard does. See docs/CONSOLE.md.

    console/command.py   the command: where the cluster is, where to listen
    console/web.py       the HTTP server: the page, its assets, the JSON API, sessions
    console/gateway.py   one user's reads and actions on the cluster (credentials seam)
    console/sampler.py   rates, send p99 and leader changes sampled from /status and /metrics
    console/static/      the page: plain JS and CSS, SVG charts, no third-party code
"""
