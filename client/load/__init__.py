"""Load testing a daemon from `rknn-client perf`: closed-loop concurrency and open-loop request-rate
sweeps, measured in windows the way perf_analyzer measures them."""
