"""dbspark's benchmark suite: each epoch's cost against the size of what changed.

Run it with ``bin/bench`` (``python -m benchmarks``); ``benchmarks/README.md`` says what
each workload measures and how to read the results.
"""
