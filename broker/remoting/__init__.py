"""The client port: the aiohttp server and its WebSocket of remoting frames (``server``: also the
composition root that wires a replica's parts), and the guards before and around a request:
connection bounds, the accept loop, frame reading, per-client limits, inflation bounds."""
