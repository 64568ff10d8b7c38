"""RocketMQ's remoting protocol in front of a RaftMQ broker and name server (issue 27):
requests are translated at the edge into RaftMQ's own frames and served by the same
processors, access checks and state (``front_end``); ``namesrv_front`` answers the name
server's codes from its route table. docs/ROCKETMQ.md says what is supported.
"""
