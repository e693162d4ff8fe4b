"""Log lines in vLLM's format: `INFO 11-29 08:15:02 [api_server.py:1885] message`.

Engine-core lines carry vLLM's process prefix `(EngineCore_DP0 pid=N) `; uvicorn's own lines use
uvicorn's `INFO:     ` format. Everything goes to stdout like vLLM's default logging config;
one lock keeps lines from concurrent requests whole.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import TextIO


@dataclass(frozen=True)
class Line:
    level: str  # INFO, WARNING, ERROR, DEBUG
    where: str  # "file.py:lineno", as vLLM prints it
    message: str
    engine: bool = False  # printed by the engine-core process in real vLLM


class Logger:
    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = stream or sys.stdout
        self._lock = threading.Lock()
        self.pid = os.getpid()

    def emit(self, line: Line) -> None:
        stamp = time.strftime("%m-%d %H:%M:%S")
        prefix = f"(EngineCore_DP0 pid={self.pid}) " if line.engine else ""
        self.raw(f"{prefix}{line.level} {stamp} [{line.where}] {line.message}")

    def info_line(self, where: str, message: str, *, engine: bool = False) -> None:
        self.emit(Line("INFO", where, message, engine))

    def error_line(self, where: str, message: str, *, engine: bool = False) -> None:
        self.emit(Line("ERROR", where, message, engine))

    def uvicorn(self, message: str) -> None:
        self.raw(f"INFO:     {message}")

    def raw(self, text: str) -> None:
        with self._lock:
            self._stream.write(text + "\n")
            self._stream.flush()
