"""Who may lead, on pysyncobj's peer connections: the reasons a replica must not stand
(``candidacy``), pre-vote before it does (``prevote``), and TimeoutNow transfers with a
leader's hand-over (``leadership_transfer``)."""
