"""Benchmarks: the model alone (model_bench), the service under HTTP load (load), peers (baselines), and the
whole comparison run (run, what `make bench` calls). Results land in benchmarks/results/."""
