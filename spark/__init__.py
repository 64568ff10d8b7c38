"""RaftMQ for Spark: the ``raftmq`` PySpark data source (``spark.datasource``) and its
Spark-free parts: options (``spark.options``), replica choice (``spark.replicas``), the
planner (``spark.planning``) and the partition reader (``spark.range_reader``, decoding
with ``spark.pages``; errors in ``spark.errors``), a query's progress for a consumer group
(``spark.progress``); the sink's options (``spark.sink_options``) and partition writer
(``spark.sink_writer``). Importing this package or any of those never imports pyspark;
``spark.datasource`` and ``spark.sink`` need the ``spark`` extra."""
