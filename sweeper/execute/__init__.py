"""Running servers: one server group on a node (`runner`: server, replay, checks, /metrics,
fingerprint), the server process group and its guard, the wire (`transport`), adaptive rounds, and the
executors that run groups (`executor`: the protocol; Ray and in-process)."""
