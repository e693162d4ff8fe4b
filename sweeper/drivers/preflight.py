"""Misconfiguration a matrix is checked for before any server starts: `VLLM_*` environment names
the vLLM version does not read, request fields outside vLLM's chat request schema, and serve flags
one typo away from one of `vllm serve`'s.

vLLM takes both without refusing: an unknown env var gets one warning line in the server log
("Unknown vLLM environment variable detected: X"), an unknown request field is dropped (logged at
DEBUG in recent releases). Either way the cell runs vLLM's default and its results describe a
configuration nobody asked for, after the GPU time is spent. Hence, per name:

* an error when the list it is checked against is the version's own (`environment_variables` of the
  installed environment's vllm/envs.py, asked by running that environment's python), or when the
  name is one typo away from a listed one (`did you mean`);
* else a warning: a pinned list (`sweeper/vllm/env_names.txt`, `sweeper.vllm.request_fields`) lags
  the releases, so a name missing from it may be new; `strict` makes these errors too.
"""

from __future__ import annotations

import difflib
import json
import os
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from sweeper.install.cache import META, cache_dir_for
from sweeper.install.registry import kind_of
from sweeper.spec.matrix import Matrix
from sweeper.vllm.request_fields import CHAT_FIELDS

ENV_NAMES_FILE = "env_names.json"  # the installed environment's own list, cached in its folder
ASK_TIMEOUT_S = 120.0
TYPO_CUTOFF = 0.85  # difflib's ratio: VLLM_USE_V2_MODEL_RUNER vs VLLM_USE_V2_MODEL_RUNNER is 0.98


@dataclass(frozen=True)
class Finding:
    """One misconfigured name: `key` as the matrix spells it (env.X, request.x), and why."""

    error: bool
    key: str
    message: str


@dataclass(frozen=True)
class Names:
    """A list of names to check against, and where it came from (said in the message)."""

    names: frozenset[str]
    source: str
    authoritative: bool  # the version's own list, not a pinned one


def pinned_env_names() -> frozenset[str]:
    text = resources.files("sweeper.vllm").joinpath("env_names.txt").read_text(encoding="utf-8")
    return frozenset(ln.split()[0] for ln in text.splitlines() if ln.strip() and not ln.startswith("#"))


def pinned_serve_flags() -> frozenset[str]:
    text = resources.files("sweeper.vllm").joinpath("serve_flags.txt").read_text(encoding="utf-8")
    return frozenset(ln.split()[0] for ln in text.splitlines() if ln.strip() and not ln.startswith("#"))


def installed_metas(matrix: Matrix, cache_dir: Path | None) -> list[tuple[Path, dict[str, object]]]:
    """The complete environments of the matrix's install kind in its cache: (root, meta), read once."""
    install = matrix.spec.install
    cache = cache_dir_for(install, Path(matrix.path).parent, cache_dir)
    out = []
    for meta_path in sorted(cache.glob(f"*/{META}")) if cache.is_dir() else []:
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(meta, dict) and meta.get("kind") == kind_of(install.kind).name:
            out.append((meta_path.parent, meta))
    return out


def installed_env_names(matrix: Matrix, commit: str, sha: str | None,
                        metas: Iterable[tuple[Path, Mapping[str, object]]]) -> Names | None:
    """The VLLM_* names of an environment already installed for this commit, if any: its own list."""
    module = kind_of(matrix.spec.install.kind).env_module
    for root, meta in metas:
        if not (meta.get("sha") == sha if sha else meta.get("commit") == commit):
            continue
        names = _ask(root, meta, module)
        if names is not None:
            version = meta.get("version") or commit
            return Names(names, f"the {version} environment's {module}", authoritative=True)
    return None


def _ask(root: Path, meta: Mapping[str, object], module: str) -> frozenset[str] | None:
    cached = root / ENV_NAMES_FILE
    try:
        return frozenset(json.loads(cached.read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError):
        pass
    python = meta.get("python")
    if not isinstance(python, str):
        return None
    code = f"import json, {module} as m; print(json.dumps(sorted(n for n in m.environment_variables)))"
    extra = meta.get("env")
    env = {**os.environ, **({str(k): str(v) for k, v in extra.items()} if isinstance(extra, dict) else {})}
    try:
        done = subprocess.run([python, "-c", code], capture_output=True, text=True, env=env, timeout=ASK_TIMEOUT_S,
                              stdin=subprocess.DEVNULL, check=False)
        names = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return None
    if not isinstance(names, list):
        return None
    from sweeper.store import files

    files.write_json(cached, names, indent=None)
    return frozenset(str(n) for n in names)


def _near(name: str, known: Iterable[str]) -> str | None:
    close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=TYPO_CUTOFF)
    return close[0] if close else None


def _where(matrix: Matrix, section: str, name: str) -> str:
    return f"axes.{section}.{name}" if any(a == f"{section}.{name}" for a, _ in matrix.axes) else f"{section}.{name}"


def check(matrix: Matrix, shas: Mapping[str, str | None], *, cache_dir: Path | None = None,
          strict: bool = False) -> list[Finding]:
    """Every env name and request field of the matrix's cells that vLLM would ignore (module docstring)."""
    pinned = Names(pinned_env_names(), "the pinned list (sweeper/vllm/env_names.txt)", authoritative=False)
    findings: dict[str, Finding] = {}
    metas = installed_metas(matrix, cache_dir)
    by_commit = {c: installed_env_names(matrix, c, shas.get(c), metas) or pinned for c in matrix.commits()}
    for cell in matrix.cells:
        names = by_commit[cell.commit]
        for name in cell.env:
            if not name.startswith("VLLM_") or name in names.names:
                continue
            near = _near(name, names.names)
            error = strict or names.authoritative or near is not None
            hint = f"; did you mean {near}?" if near else ";"
            key = _where(matrix, "env", name)
            findings.setdefault(key, Finding(error, key, f"{name} is not a variable vLLM reads ({names.source}, "
                                                         f"commit {cell.commit}){hint} vLLM would warn and run "
                                                         "its default"))
    for cell in matrix.cells:
        for name in cell.request:
            if name in CHAT_FIELDS:
                continue
            near = _near(name, CHAT_FIELDS)
            key = _where(matrix, "request", name)
            hint = f"; did you mean {near}?" if near else ";"
            findings.setdefault(key, Finding(strict or near is not None, key,
                                             f"{name} is not a field of vLLM's chat request (the pinned schema, "
                                             f"sweeper/vllm/request_fields.py){hint} vLLM would ignore it"))
    # A serve flag one typo away from one of `vllm serve`'s is refused: vLLM would refuse to start, after
    # the install and a GPU's start-up. Any other flag is left to the installed version's `--help`
    # (`sweeper.vllm.flags`), which knows the flags of releases newer than the pinned list.
    flags = pinned_serve_flags()
    for cell in matrix.cells:
        for flag in cell.serve:
            positive = "--" + flag.removeprefix("--no-") if flag.startswith("--no-") else flag
            if positive in flags or (near := _near(positive, flags)) is None:
                continue
            key = _where(matrix, "serve", flag)
            findings.setdefault(key, Finding(True, key, f"{flag} is not a flag of vllm serve (the pinned list, "
                                                        f"sweeper/vllm/serve_flags.txt); did you mean {near}? "
                                                        "vLLM would refuse to start"))
    return sorted(findings.values(), key=lambda f: (not f.error, f.key))
