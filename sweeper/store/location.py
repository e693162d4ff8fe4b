"""Where results live: a local folder or a pyarrow filesystem URI (`s3://bucket/prefix`, `gs://…`,
`file:///…`), behind one small interface that the run store uses for every read and write.

A write is atomic on every filesystem: the bytes go to a temporary name beside the target (a dot
name ending in `.tmp`, which no reader lists) and are then renamed over it (a rename on a local
disk; a server-side copy on object stores, which never shows a half object). Errors of the
filesystem (an unreachable endpoint, a missing bucket, a denied write) become one-line `StoreError`s.

Query parameters of a URI (`?endpoint_override=…&scheme=http`) configure the filesystem and are
never shown: they may hold credentials.
"""

from __future__ import annotations

import hashlib
import os
import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import pyarrow as pa
import pyarrow.fs as pafs

from sweeper.errors import StoreError, one_line
from sweeper.store import files

_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_FILESYSTEMS: dict[str, tuple[pafs.FileSystem, str]] = {}


def is_uri(where: str | os.PathLike[str]) -> bool:
    return isinstance(where, str) and bool(_URI.match(where))


@contextmanager
def _errors(what: str) -> Iterator[None]:
    """Filesystem failures (OSError, Arrow errors) as one-line StoreErrors naming `what`."""
    try:
        yield
    except StoreError:
        raise
    except FileNotFoundError:
        raise
    except (OSError, pa.ArrowException) as exc:
        raise StoreError(f"{what}: {one_line(str(exc) or type(exc).__name__)[:300]}") from None


@dataclass(frozen=True, eq=False)
class Location:
    """A file or folder on some filesystem: `fs` with the `path` inside it; `shown` for messages."""

    fs: pafs.FileSystem
    path: str
    shown: str
    local: bool

    @classmethod
    def parse(cls, where: str | os.PathLike[str] | Location) -> Location:
        if isinstance(where, Location):
            return where
        if not is_uri(where):
            text = os.fspath(where)
            return cls(_local_fs(), os.path.abspath(text), text, True)
        text = str(where)
        base, _, query = text.partition("?")
        scheme, rest = base.split("://", 1)
        scheme = scheme.lower()
        if scheme == "file":
            path = os.path.abspath(rest or "/")
            return cls(_local_fs(), path, path, True)
        # One filesystem object per endpoint (making one can cost a round trip).
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or ""
        key = f"{scheme}://{rest.split('/', 1)[0]}?{query}#{endpoint}"
        if key not in _FILESYSTEMS:
            with _errors(base):
                try:
                    _FILESYSTEMS[key] = pafs.FileSystem.from_uri(text)
                except (pa.ArrowInvalid, ValueError) as exc:
                    raise StoreError(f"{base}: not a filesystem URI pyarrow knows: {one_line(str(exc))[:200]}") \
                        from None
        fs = _FILESYSTEMS[key][0]
        path = rest if scheme in ("s3", "gs", "gcs") else pafs.FileSystem.from_uri(text)[1]
        path = path.rstrip("/")
        if isinstance(fs, pafs.LocalFileSystem):
            return cls(_local_fs(), path, path, True)
        return cls(fs, path, f"{scheme}://{path}", False)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Location) and (self.fs.type_name, self.path) == (other.fs.type_name, other.path)

    def __hash__(self) -> int:
        return hash((self.fs.type_name, self.path))

    # ---- names -------------------------------------------------------------------------------

    def join(self, *parts: str) -> Location:
        if self.local:
            return Location(self.fs, os.path.join(self.path, *parts), os.path.join(self.shown, *parts), True)
        return Location(self.fs, str(PurePosixPath(self.path, *parts)), "/".join([self.shown, *parts]), False)

    @property
    def name(self) -> str:
        return PurePosixPath(self.path).name

    @property
    def parent(self) -> Location:
        if self.local:
            return Location(self.fs, os.path.dirname(self.path), os.path.dirname(self.shown) or ".", True)
        return Location(self.fs, str(PurePosixPath(self.path).parent), self.shown.rsplit("/", 1)[0], False)

    def as_path(self) -> Path:
        if not self.local:
            raise StoreError(f"{self.shown} is not on this machine's disk")
        return Path(self.shown)

    def __str__(self) -> str:
        return self.shown

    # ---- reads -------------------------------------------------------------------------------

    def info(self) -> pafs.FileInfo:
        with _errors(self.shown):
            return self.fs.get_file_info(self.path)

    def exists(self) -> bool:
        return bool(self.info().type != pafs.FileType.NotFound)

    def is_file(self) -> bool:
        return bool(self.info().type == pafs.FileType.File)

    def is_dir(self) -> bool:
        return bool(self.info().type == pafs.FileType.Directory)

    def listing(self) -> list[pafs.FileInfo]:
        """The entries right inside this folder (none when it does not exist), by name."""
        with _errors(self.shown):
            found = self.fs.get_file_info(pafs.FileSelector(self.path, allow_not_found=True))
        return sorted(found, key=lambda i: i.base_name)

    def parquet_files(self) -> dict[str, pafs.FileInfo]:
        """`*.parquet` right inside this folder, by name without the suffix (temporary files of
        unfinished writes left out)."""
        return {i.base_name[:-len(".parquet")]: i for i in self.listing()
                if i.type == pafs.FileType.File and i.base_name.endswith(".parquet")
                and not i.base_name.startswith(".")}

    def read_bytes(self, limit: int | None = None) -> bytes:
        """The whole file (FileNotFoundError when absent); more than `limit` bytes is an error."""
        with _errors(self.shown):
            info = self.fs.get_file_info(self.path)
            if info.type == pafs.FileType.NotFound:
                raise FileNotFoundError(self.shown)
            if info.type != pafs.FileType.File:
                raise StoreError(f"{self.shown}: not a file")
            if limit is not None and info.size is not None and info.size > limit:
                raise StoreError(f"{self.shown}: {info.size:,} bytes, more than the {limit:,} expected")
            with self.fs.open_input_stream(self.path) as f:
                return bytes(f.read())

    # ---- writes ------------------------------------------------------------------------------

    def write_atomic(self, data: bytes | pa.Buffer) -> None:
        """The whole content under a temporary name beside the target, then renamed over it (on a
        local disk through `files.replacing`, which also syncs it)."""
        if self.local:
            with _errors(self.shown), files.replacing(self.path) as local_tmp:
                local_tmp.write_bytes(memoryview(data))
            return
        tmp = self.parent.join(f".{self.name}.{uuid.uuid4().hex[:12]}.tmp")
        with _errors(self.shown):
            if self.local:
                os.makedirs(os.path.dirname(self.path), exist_ok=True)
            try:
                with self.fs.open_output_stream(tmp.path) as f:
                    f.write(data)
                self.fs.move(tmp.path, self.path)
            except BaseException:
                with suppress(OSError, pa.ArrowException):
                    self.fs.delete_file(tmp.path)
                raise

    def move(self, to: Location) -> None:
        with _errors(self.shown):
            if to.local:
                os.makedirs(os.path.dirname(to.path), exist_ok=True)
            self.fs.move(self.path, to.path)

    def make_dir(self) -> None:
        """A folder (object stores have none: nothing to make there)."""
        if self.local:
            with _errors(self.shown):
                os.makedirs(self.path, exist_ok=True)


def _local_fs() -> pafs.LocalFileSystem:
    fs = _FILESYSTEMS.get("")
    if fs is None:
        fs = (pafs.LocalFileSystem(), "")
        _FILESYSTEMS[""] = fs
    return fs[0]


def is_temp_name(name: str) -> bool:
    return name.startswith(".") and name.endswith(".tmp")


def local_side(runs_dir: str | os.PathLike[str] | Location) -> Path:
    """A folder on this machine for what belongs beside the runs but must be local (git clones,
    simulated histories, server logs and process-group files while a group runs): the runs folder
    itself when it is local, else a folder keyed by the URI under the sweep cache."""
    loc = Location.parse(runs_dir)
    if loc.local:
        return loc.as_path()
    cache = os.environ.get("SWEEP_CACHE")
    base = Path(cache).expanduser().parent if cache else Path.home() / ".cache" / "sweep"
    return base / "remote" / hashlib.sha256(loc.shown.encode()).hexdigest()[:16]
