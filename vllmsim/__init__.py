"""A vLLM-compatible server for tests and demos: same `vllm serve` flags, HTTP API, log lines and
/metrics, with the behaviour of each simulated commit (version, install health, speed, bugs) declared
in that commit's `sim.yaml`. The product reaches it only as a command line, never by import.
"""
