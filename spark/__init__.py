"""RaftMQ for Spark: the ``raftmq`` PySpark data source (``spark.datasource``) and its
Spark-free planner and partition reader (``spark.reader``). Importing this package
never imports pyspark; ``spark.datasource`` needs the ``spark`` extra."""
