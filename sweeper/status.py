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
