"""`vllm bench sweep` param files as a matrix's axes: the same combinations `vllm bench sweep serve
--dry-run` lists for them.

The expected lists are written here by hand from vLLM's documented semantics
(vllm/benchmarks/sweep/param_sweep.py, serve.py): for each serve record, the serve command is the
base command with the record applied (a key's option replaced where the base has it, appended
otherwise; `_` spelled `-` before the first dot; `true` -> `--flag`, `false` -> `--no-flag`; a mapping
as JSON), and for each serve record every bench record runs against that server.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sweeper.errors import ConfigError
from sweeper.install.matrix_loader import load_matrix
from sweeper.vllm.flags import Command, serve_command

ROOT = Path(__file__).resolve().parent.parent

SERVE = {
    "small": {"max_num_seqs": 32, "enable_prefix_caching": True},
    "large": {"max-num-seqs": 64, "enable_prefix_caching": False,
              "speculative_config": {"method": "ngram", "num_speculative_tokens": 3}},
    "mtp": {"max_num_seqs": 64, "gpu_memory_utilization": 0.9, "speculative_config.num_speculative_tokens": 2},
}
BENCH = [{"max_concurrency": c, "request_rate": r, "random_input_len": 128, "random_output_len": 32,
          "num_prompts": 20} for c in (1, 8) for r in (4, "inf")]

# What `vllm bench sweep serve --serve-cmd "vllm serve M --gpu-memory-utilization 0.8" --dry-run` prints
# as each server's command (past the model), by vLLM's rules: the base option replaced in place.
EXPECTED_SERVERS = {
    "small": ["--gpu-memory-utilization", "0.8", "--max-num-seqs", "32", "--enable-prefix-caching"],
    "large": ["--gpu-memory-utilization", "0.8", "--max-num-seqs", "64", "--no-enable-prefix-caching",
              "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3}'],
    "mtp": ["--gpu-memory-utilization", "0.9", "--max-num-seqs", "64",
            "--speculative-config.num_speculative_tokens", "2"],
}
# ... and each benchmark's load: every bench record against every server.
EXPECTED_LOADS = [(1, 4.0), (1, float("inf")), (8, 4.0), (8, float("inf"))]


def _options(argv: list[str]) -> dict[str, Any]:
    """An argv as option -> value (None for a bare flag; JSON values parsed), order aside."""
    out: dict[str, Any] = {}
    i = 0
    while i < len(argv):
        flag, _, inline = argv[i].partition("=")
        if inline:
            out[flag], i = inline, i + 1
        elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            value = argv[i + 1]
            try:
                out[flag] = json.loads(value) if value.startswith("{") else value
            except json.JSONDecodeError:
                out[flag] = value
            i += 2
        else:
            out[flag], i = None, i + 1
    return out


def _matrix(tmp_path: Path, serve: Any = SERVE, bench: Any = BENCH, extra: str = "") -> Path:
    (tmp_path / "serve.json").write_text(json.dumps(serve))
    (tmp_path / "bench.json").write_text(json.dumps(bench))
    suite = ROOT / "suites" / "structured-output.yaml"
    path = tmp_path / "m.yaml"
    path.write_text(f"""name: sweep-params
model: M
suite: {suite}
install: {{kind: sim, repo: "sim:demo"}}
serve: {{--gpu-memory-utilization: 0.8}}
axes:
  commit: [v0.27.0]
vllm_bench_sweep:
  serve_params: serve.json
  bench_params: bench.json
{extra}""")
    return path


def test_the_combinations_are_vllm_bench_sweeps(tmp_path: Path) -> None:
    matrix = load_matrix(_matrix(tmp_path, bench=BENCH).as_posix())
    servers = []
    for cell in matrix.cells:
        launch = serve_command(cell, model="M", spec_config=None, installed=Command(("vllm", "serve")),
                               host="h", port=1, api_key=None)
        servers.append(_options(list(launch.argv[7:])))  # past `vllm serve M --host h --port 1`
    expected = [_options(argv) for argv in EXPECTED_SERVERS.values()]
    assert sorted(repr(sorted(s.items())) for s in servers) == sorted(repr(sorted(e.items())) for e in expected)
    assert matrix.spec.bench is not None
    loads = [(p.concurrency, p.request_rate) for p in matrix.spec.bench.points()]
    assert loads == EXPECTED_LOADS
    assert (matrix.spec.bench.input_len, matrix.spec.bench.output_len, matrix.spec.bench.num_prompts) == (128, 32, 20)
    # Every server runs every bench record: 3 × 4 combinations, as vLLM's dry run lists them.
    assert len(matrix.cells) * len(loads) == len(SERVE) * len(BENCH)


@pytest.mark.parametrize(("serve", "bench", "words"), [
    ({"a": {"max_num_seqs": 1, "max-num-seqs": 2}}, BENCH, "set twice"),
    (SERVE, [{"max_concurrency": 1, "random_prefix_len": 3}], "random_prefix_len"),
    (SERVE, [{"max_concurrency": 1, "num_prompts": 5}, {"max_concurrency": 2, "num_prompts": 6}], "differs"),
    (SERVE, [{"max_concurrency": 1, "request_rate": 2}, {"max_concurrency": 8}], "every concurrency"),
    ([{"max_num_seqs": 1}, "x"], BENCH, "expected a record"),
])
def test_what_cannot_run_unchanged_is_one_line_naming_the_file(tmp_path: Path, serve: Any, bench: Any,
                                                               words: str) -> None:
    path = _matrix(tmp_path, serve, bench)
    with pytest.raises(ConfigError) as info:
        load_matrix(path.as_posix())
    assert words in str(info.value) and ".json" in str(info.value) and "\n" not in str(info.value)
