"""Getting vLLM (or the simulator) at a commit: the install kinds and their registry
(`sweeper.install.registry`), the per-node environment cache, the repositories the commits come from,
and the matrix loader (`sweeper.install.matrix_loader`), where a matrix meets the registry.

This file imports nothing: importing one module of the package loads that module and what it uses,
not every installer (the registry loads the kinds, and with them git and subprocesses).
"""
