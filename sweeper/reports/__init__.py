"""Readers of stored results: tables and heatmaps, the HTML page, the bug report, a comparison of two
runs, explain as JSON, the bisect and triage reports, what a run spent, the dry-run preview, and a
stored run as a library user opens it (`run`). They start nothing and import nothing from `execute/`,
`install/` or `drivers/`."""
