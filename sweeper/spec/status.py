"""The outcomes the sweeper records, one enum per state set; Parquet stores their string values.

A leaf module: the runner, the server, the error tree, the reports and bisect's pure core all
name these states without importing one another.
"""

from __future__ import annotations

from enum import StrEnum


class Status(StrEnum):
    """A cell's outcome (the `status` column of a cell row)."""

    OK = "ok"
    INSTALL_FAILED = "install_failed"
    SERVER_FAILED = "server_failed"
    TIMEOUT = "timeout"
    CRASHED = "crashed"
    ERROR = "error"  # the group raised: a bug of the sweeper or of its inputs, with its traceback


class ProbeStatus(StrEnum):
    """A bisect probe's outcome for one cell (the `status` column of a probe row): its cell's status,
    or MISSING when the probe's group returned no row for the cell."""

    OK = Status.OK.value
    INSTALL_FAILED = Status.INSTALL_FAILED.value
    SERVER_FAILED = Status.SERVER_FAILED.value
    TIMEOUT = Status.TIMEOUT.value
    CRASHED = Status.CRASHED.value
    ERROR = Status.ERROR.value
    MISSING = "missing"


class Transport(StrEnum):
    """How an answer failed on the wire, whatever its checks would say (the `transport` column of a
    sample row; null when the answer came whole). `sweeper.execute.transport` names them."""

    REFUSED = "refused"  # no connection: nothing listens on the port
    RESET = "reset"  # the server reset the connection (a TCP RST)
    CLOSED_EARLY = "closed_early"  # the connection closed before the answer ended (no length to compare)
    TRUNCATED = "truncated"  # fewer body bytes came than Content-Length announced
    INVALID_UTF8 = "invalid_utf8"  # bytes that are not UTF-8 in the body or the stream
    CONTENT_TYPE = "content_type"  # a 200 that is not application/json (plain) or text/event-stream (stream)
    TOO_LARGE = "too_large"  # the body grew past the response cap (`max_response_mb`)
    TIMEOUT_CONNECT = "timeout_connect"  # no connection within the request timeout
    TIMEOUT_READ = "timeout_read"  # connected and sent, but no answer (status line) in time
    TIMEOUT_TOTAL = "timeout_total"  # the answer was coming but did not end in time (a slow drip)
    NOT_JSON = "not_json"  # a 200 body, or a stream event, that is not a JSON object
    BAD_SSE = "bad_sse"  # a stream line that is no server-sent-events field
    NO_DONE = "no_done"  # the stream ended without `data: [DONE]`
    ERROR = "error"  # any other transport error (its type and message say which)

    @property
    def timed_out(self) -> bool:
        return self in (Transport.TIMEOUT_CONNECT, Transport.TIMEOUT_READ, Transport.TIMEOUT_TOTAL)
