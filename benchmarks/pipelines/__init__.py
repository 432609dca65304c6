"""The Spark Declarative Pipelines projects of the benchmark (see ``benchmarks/sdp.py``)."""
