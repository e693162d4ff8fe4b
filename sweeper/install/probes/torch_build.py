"""Print, as JSON, the torch distribution's version and the CUDA version its build targets:
`{"torch": "2.9.0", "cuda": "12.8"}`, nulls where there is none. The CUDA version needs the
import of torch (a few seconds); it is asked only when torch is installed.

    python -I torch_build.py torch
"""

from __future__ import annotations

import importlib
import json
import sys
from importlib import metadata


def build(dist: str) -> dict[str, str | None]:
    out: dict[str, str | None] = {"torch": None, "cuda": None}
    try:
        out["torch"] = metadata.version(dist)
    except metadata.PackageNotFoundError:
        return out
    try:
        # Imported by name: this probe runs in environments that have torch, not in ours.
        cuda = importlib.import_module("torch").version.cuda
        out["cuda"] = cuda if isinstance(cuda, str) else None
    except Exception:  # noqa: BLE001  (a broken torch still has a version; CUDA stays unknown)
        out["cuda"] = None
    return out


if __name__ == "__main__":
    print(json.dumps(build(sys.argv[1] if len(sys.argv) > 1 else "torch")))
