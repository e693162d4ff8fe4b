"""The drivers that chain the layers for the CLI and the library: a sweep (`sweep`, `rerun`), a bisect
(`bisect`, `bisect_evidence`), a triage, stored runs' housekeeping (`runs`) and the checks made before
any server starts (`preflight`). Each takes its executor; none knows the CLI."""
