"""Refresh the pinned vLLM lists from a release's wheel on the package index, without installing it.

    .venv/bin/python scripts/refresh_vllm_lists.py                  # the newest release: print what changes
    .venv/bin/python scripts/refresh_vllm_lists.py 0.34.0 --write   # rewrite the lists from 0.34.0

The lists check a matrix before anything is installed (`sweeper/drivers/preflight.py`):
`sweeper/vllm/env_names.txt` (the `VLLM_*` variables vLLM reads), `sweeper/vllm/request_fields.py`
(the fields of its chat request) and `sweeper/vllm/serve_flags.txt` (the flags of `vllm serve`). They
are read from the release's own source files inside its wheel (`vllm/envs.py`, the module defining
`ChatCompletionRequest`, `EngineArgs` and `FrontendArgs` with the `add_argument` calls beside them)
by `ast`, never imported. Only those members of the wheel are fetched, by HTTP range requests into
the zip file (a wheel is 200-300 MB; the files read are under 1 MB), so a refresh takes seconds.

Each list keeps what it held and adds the release's names (a variable or field one release retires is
still read by the releases a matrix may name), and records the release it was last refreshed from.
"""

from __future__ import annotations

import argparse
import ast
import io
import re
import sys
import zipfile
from pathlib import Path

import httpx
from packaging.version import InvalidVersion, Version

ROOT = Path(__file__).resolve().parent.parent
VLLM_DIR = ROOT / "sweeper" / "vllm"
INDEX = "https://pypi.org/simple"
BLOCK = 1 << 16


class RangeFile(io.RawIOBase):
    """A remote file read by HTTP range requests: enough of a file object for `zipfile`."""

    def __init__(self, client: httpx.Client, url: str) -> None:
        self.client, self.url, self.pos = client, url, 0
        head = client.head(url, follow_redirects=True)
        head.raise_for_status()
        self.size = int(head.headers["content-length"])
        self.cache: dict[int, bytes] = {}

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self.pos = {io.SEEK_SET: offset, io.SEEK_CUR: self.pos + offset, io.SEEK_END: self.size + offset}[whence]
        return self.pos

    def _block(self, index: int) -> bytes:
        if index not in self.cache:
            start = index * BLOCK
            end = min(self.size, start + BLOCK) - 1
            resp = self.client.get(self.url, headers={"Range": f"bytes={start}-{end}"}, follow_redirects=True)
            if resp.status_code != 206:
                raise SystemExit(f"error: {self.url}: the server answered {resp.status_code} to a range request")
            self.cache[index] = resp.content
        return self.cache[index]

    def read(self, size: int = -1) -> bytes:
        end = self.size if size < 0 else min(self.size, self.pos + size)
        out = bytearray()
        while self.pos < end:
            block = self._block(self.pos // BLOCK)
            offset = self.pos % BLOCK
            piece = block[offset:offset + end - self.pos]
            out += piece
            self.pos += len(piece)
        return bytes(out)

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        data = self.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)


def wheel_url(client: httpx.Client, index: str, version: str | None) -> tuple[str, str]:
    """(version, URL of a wheel of it): the newest release when `version` is None."""
    resp = client.get(f"{index.rstrip('/')}/vllm/", headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    resp.raise_for_status()
    wheels: dict[Version, str] = {}
    for f in resp.json()["files"]:
        m = re.match(r"vllm-([^-]+)-.*\.whl$", f["filename"])
        if not m or f.get("yanked"):
            continue
        try:
            v = Version(m.group(1))
        except InvalidVersion:
            continue
        if not v.is_prerelease and not v.local:
            wheels.setdefault(v, f["url"])
    if not wheels:
        raise SystemExit(f"error: no vllm wheel on {index}")
    chosen = Version(version) if version else max(wheels)
    if chosen not in wheels:
        raise SystemExit(f"error: vllm {version}: no wheel on {index} (newest: {max(wheels)})")
    return str(chosen), wheels[chosen]


def env_names(source: str) -> set[str]:
    """The keys of `environment_variables` in vllm/envs.py."""
    for node in ast.walk(ast.parse(source)):
        target = node.target if isinstance(node, ast.AnnAssign) else (
            node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None)
        value = getattr(node, "value", None)
        if isinstance(target, ast.Name) and target.id == "environment_variables" and isinstance(value, ast.Dict):
            return {k.value for k in value.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
    raise SystemExit("error: vllm/envs.py: no environment_variables dict")


def class_fields(source: str, name: str) -> set[str] | None:
    """The annotated fields of class `name` in `source`, None when it is not defined there."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and node.name == name:
            return {s.target.id for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
                    and not s.target.id.startswith("_")}
    return None


def classes(source: str) -> list[str]:
    return [n.name for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ClassDef)]


def argument_flags(source: str) -> set[str]:
    """Every "--flag" literal passed to an `add_argument` call."""
    flags: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
            flags |= {a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)
                      and a.value.startswith("--")}
    return flags


def read_release(client: httpx.Client, url: str) -> tuple[set[str], set[str], set[str]]:
    """(env names, chat request fields, serve flags) of the wheel at `url`."""
    with zipfile.ZipFile(RangeFile(client, url)) as wheel:
        names = wheel.namelist()

        def text(member: str) -> str:
            return wheel.read(member).decode("utf-8")

        env = env_names(text("vllm/envs.py"))
        fields: set[str] | None = None
        for member in sorted(n for n in names if n.startswith("vllm/entrypoints/") and n.endswith("protocol.py")):
            if "class ChatCompletionRequest" in (body := text(member)):
                fields = class_fields(body, "ChatCompletionRequest")
                break
        if not fields:
            raise SystemExit("error: no ChatCompletionRequest in the wheel's vllm/entrypoints/**/protocol.py")
        flags: set[str] = set()
        # Where the serve flags are declared moves between releases (vllm/entrypoints/openai/cli_args.py,
        # vllm/entrypoints/common/cli_args.py, ...): every `*cli_args.py` and `arg_utils.py` is read.
        for member in sorted(n for n in names if n.endswith(("cli_args.py", "engine/arg_utils.py"))
                             or n == "vllm/entrypoints/cli/serve.py"):
            body = text(member)
            for cls in classes(body):
                if cls.endswith(("EngineArgs", "FrontendArgs")):
                    flags |= {"--" + f.replace("_", "-") for f in class_fields(body, cls) or ()}
            flags |= argument_flags(body)
        if not flags:
            raise SystemExit("error: no serve flags found in the wheel (EngineArgs, FrontendArgs)")
    return env, fields, flags


def _listed(path: Path) -> set[str]:
    if not path.exists():
        return set()
    return {ln.split()[0] for ln in path.read_text().splitlines() if ln.strip() and not ln.startswith("#")}


def _chat_fields_now() -> set[str]:
    tree = ast.parse((VLLM_DIR / "request_fields.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Set):
            return {e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
    return set()


def _text_list(header: str, names: set[str]) -> str:
    return header + "".join(f"{n}\n" for n in sorted(names))


def _set_lines(fields: set[str]) -> list[str]:
    body, line = [], "   "
    for name in sorted(fields):
        item = f' "{name}",'
        if len(line) + len(item) > 110:
            body.append(line)
            line = "   "
        line += item
    body.append(line)
    return body


def _with_simulator_fields(source: str, fields: set[str]) -> str:
    """vllmsim/request.py with its CHAT_FIELDS set rewritten: the simulator stands for the same vLLM
    (tests/test_misconfig.py keeps the two lists equal; the packages may not import each other)."""
    start = source.index("CHAT_FIELDS: frozenset[str] = frozenset({\n")
    end = source.index("\n})\n", start)
    head = "CHAT_FIELDS: frozenset[str] = frozenset({\n"
    return source[:start] + head + "\n".join(_set_lines(fields)) + source[end:]


def _fields_module(version: str, fields: set[str]) -> str:
    body = _set_lines(fields)
    return (
        '"""The fields of a chat-completions request that vLLM reads: OpenAI\'s ChatCompletion request and\n'
        "vLLM's own extensions (`ChatCompletionRequest` in vLLM's entrypoints), pinned here and refreshed by\n"
        "`scripts/refresh_vllm_lists.py` from a release's wheel.\n\n"
        "vLLM accepts any other field and ignores it (\"The following fields were present in the request but\n"
        "ignored: {...}\", at WARNING in older releases, at DEBUG in recent ones, so usually unseen): a typo in\n"
        "`request.temprature` runs the default temperature. A matrix's request fields are checked against this\n"
        "list before anything starts (`sweeper.drivers.preflight`). New vLLM releases add fields; a field missing\n"
        "here is warned about, not refused, unless it is one edit away from a listed one.\n"
        '"""\n\nfrom __future__ import annotations\n\n'
        f'# The release the list was last refreshed from (it keeps what earlier releases read).\nSOURCE = "vllm {version}"\n\n'
        "CHAT_FIELDS: frozenset[str] = frozenset({\n" + "\n".join(body) + "\n})\n"
    )


ENV_HEADER = """# VLLM_* variables vLLM reads, pinned for checking a matrix before anything is installed
# (`sweeper/drivers/preflight.py`; the installed environment's own vllm/envs.py is asked when there is
# one). Refreshed by scripts/refresh_vllm_lists.py from vllm {version}'s envs.py, keeping the names
# earlier releases read. One list for every version: a name missing here is warned about, and
# refused only when it is one typo away from a listed one.
"""
FLAGS_HEADER = """# `vllm serve` flags, pinned for checking a matrix before anything is installed
# (`sweeper/drivers/preflight.py`: a flag one typo away from a listed one is refused; the installed
# environment's own `--help` decides the rest). Refreshed by scripts/refresh_vllm_lists.py from
# vllm {version}'s EngineArgs, FrontendArgs and add_argument calls, keeping earlier releases' flags.
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("version", nargs="?", help="a vLLM release (default: the newest on the index)")
    ap.add_argument("--index", default=INDEX, help=f"a PEP 691 simple index (default {INDEX})")
    ap.add_argument("--write", action="store_true", help="rewrite the lists (default: print what would change)")
    args = ap.parse_args(argv)
    with httpx.Client(timeout=60) as client:
        version, url = wheel_url(client, args.index, args.version)
        env, fields, flags = read_release(client, url)
    old_env, old_fields = _listed(VLLM_DIR / "env_names.txt"), _chat_fields_now()
    old_flags = _listed(VLLM_DIR / "serve_flags.txt")
    print(f"vllm {version}: {len(env)} env names ({len(env - old_env)} new), {len(fields)} request fields "
          f"({len(fields - old_fields)} new), {len(flags)} serve flags ({len(flags - old_flags)} new)")
    for label, new in (("env", env - old_env), ("request", fields - old_fields), ("flag", flags - old_flags)):
        if new:
            print(f"  new {label}: " + ", ".join(sorted(new)))
    if args.write:
        (VLLM_DIR / "env_names.txt").write_text(_text_list(ENV_HEADER.format(version=version), old_env | env))
        (VLLM_DIR / "request_fields.py").write_text(_fields_module(version, old_fields | fields))
        (VLLM_DIR / "serve_flags.txt").write_text(_text_list(FLAGS_HEADER.format(version=version), old_flags | flags))
        sim = ROOT / "vllmsim" / "request.py"
        sim.write_text(_with_simulator_fields(sim.read_text(), old_fields | fields))
        print("written: sweeper/vllm/env_names.txt, sweeper/vllm/request_fields.py, sweeper/vllm/serve_flags.txt, "
              "vllmsim/request.py")
    return 0


if __name__ == "__main__":
    sys.exit(main())
