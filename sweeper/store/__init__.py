"""What is stored, and the only writer of it: run folders on a local folder or a filesystem URI
(`run_folder`, `location`), typed manifests and records (`manifest`, `triage_record`, `env_record`), the
catalogue of stored evidence, pandas/DuckDB readers (`frames`), repair of a damaged run, and atomic
files (`files`)."""
