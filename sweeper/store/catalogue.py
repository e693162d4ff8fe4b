"""Which stored files hold which experiments, so that a bisect opens only those.

Each run keeps `catalogue.json`: one entry per Parquet file of its `samples/`, `cells/` and
`probes/`, with the file's size and modification time as listed and the distinct
(settings_key, suite_digest, commit_sha) it holds. The run's driver, its only writer, adds an entry
right after each file it writes (the file first: a crash in between leaves a file the catalogue
lacks, never an entry without its file).

The catalogue is a cache of what the run's folder listing says is there, and the listing decides:
a reader trusts the entries whose file is listed with the same size and time, drops the others,
and indexes only the files it lacks (a run written before catalogues existed, one copied in, one
whose catalogue is lost or damaged) by reading their key columns; it then writes the catalogue back
where it can. Several sweeps writing into one runs folder each keep their own run's catalogue, so
none loses another's entries, and no lock is needed on any filesystem; a reader that saves while a
run's driver writes may drop the driver's newest entry, which the next listing finds again.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from sweeper.errors import StoreError
from sweeper.store.location import Location

CATALOGUE = "catalogue.json"
VERSION = 1
INDEXED = ("samples", "cells", "probes")
KEY_COLUMNS = ("settings_key", "suite_digest", "commit_sha")
_LIMIT = 256 * 2**20

Key = tuple[str | None, str | None, str | None]


@dataclass(frozen=True)
class Entry:
    """One stored file: as listed (size, time) when indexed, and the experiments it holds."""

    size: int | None
    mtime_ns: int | None
    keys: frozenset[Key]

    def listed_as(self, info: pafs.FileInfo) -> bool:
        return (self.size, self.mtime_ns) == (info.size, info.mtime_ns)


@dataclass(frozen=True)
class Wanted:
    """The experiments a bisect can reuse: these settings at these commits under this suite. A file
    without a suite digest (probes) matches any."""

    settings_keys: frozenset[str]
    suite_digest: str
    commit_shas: frozenset[str]

    def matches(self, key: Key) -> bool:
        settings, digest, sha = key
        return (settings in self.settings_keys and sha in self.commit_shas
                and (digest is None or digest == self.suite_digest))


def keys_of(tbl: pa.Table) -> frozenset[Key]:
    """The distinct (settings_key, suite_digest, commit_sha) of a table (a missing column is None)."""
    names = [c for c in KEY_COLUMNS if c in tbl.column_names]
    if not names or tbl.num_rows == 0:
        return frozenset()
    distinct = tbl.select(names).group_by(names).aggregate([]).to_pylist()
    return frozenset((row.get(KEY_COLUMNS[0]), row.get(KEY_COLUMNS[1]), row.get(KEY_COLUMNS[2]))
                     for row in distinct)


def _index_file(where: Location) -> frozenset[Key] | None:
    """The keys a stored file holds, read from its key columns; None when it does not read (damage is
    for `RunDir.scan` to report; such a file is indexed again once it has been replaced)."""
    try:
        with where.fs.open_input_file(where.path) as f:
            parquet = pq.ParquetFile(f)
            names = [c for c in KEY_COLUMNS if c in parquet.schema_arrow.names]
            return keys_of(parquet.read(columns=names))
    except (OSError, pa.ArrowException):
        return None


@dataclass
class RunCatalogue:
    """One run's catalogue: `entries[(kind, name)]`, `name` being the file name without `.parquet`."""

    run: Location
    entries: dict[tuple[str, str], Entry] = field(default_factory=dict)

    @property
    def file(self) -> Location:
        return self.run.join(CATALOGUE)

    @classmethod
    def current(cls, run: Location, *, save: bool = True) -> RunCatalogue:
        """The run's catalogue brought in line with its listing (files it lacked indexed); saved
        when that changed it and `save` (a read-only store is read all the same)."""
        cat = cls.stored(run)
        if cat.reconcile() and save:
            # Not writable here: the next reader indexes the same files again.
            with contextlib.suppress(StoreError):
                cat.save()
        return cat

    @classmethod
    def stored(cls, run: Location) -> RunCatalogue:
        """The run's catalogue as stored, not yet checked against the listing."""
        return cls(run, cls._read(run.join(CATALOGUE)))

    @staticmethod
    def _read(where: Location) -> dict[tuple[str, str], Entry]:
        """The stored entries; none when the file is absent, damaged or of another version (rebuilt)."""
        try:
            data = json.loads(where.read_bytes(_LIMIT).decode())
            if data.get("version") != VERSION:
                return {}
            return {(f["kind"], f["name"]): Entry(f["size"], f["mtime_ns"],
                                                  frozenset(tuple(k) for k in f["keys"]))
                    for f in data["files"] if f["kind"] in INDEXED and all(len(k) == 3 for k in f["keys"])}
        except (FileNotFoundError, StoreError, UnicodeDecodeError, ValueError, RecursionError,
                AttributeError, KeyError, TypeError):
            return {}

    def reconcile(self) -> bool:
        """Entries of files no longer listed as indexed dropped, listed files without one indexed;
        True when anything changed."""
        changed = False
        listed = {(kind, name): info for kind in INDEXED for name, info in self.run.join(kind).parquet_files().items()}
        for key in [k for k, e in self.entries.items() if k not in listed or not e.listed_as(listed[k])]:
            del self.entries[key]
            changed = True
        for (kind, name), info in sorted(listed.items()):
            if (kind, name) not in self.entries:
                keys = _index_file(self.run.join(kind, f"{name}.parquet"))
                if keys is not None:
                    self.entries[(kind, name)] = Entry(info.size, info.mtime_ns, keys)
                    changed = True
        return changed

    def add(self, kind: str, name: str, info: pafs.FileInfo, keys: frozenset[Key]) -> None:
        self.entries[(kind, name)] = Entry(info.size, info.mtime_ns, keys)

    def forget(self, kind: str, name: str) -> None:
        self.entries.pop((kind, name), None)

    def names(self, kind: str, wanted: Wanted) -> list[str]:
        """The files of `kind` holding any wanted experiment, by name."""
        return sorted(name for (k, name), e in self.entries.items() if k == kind and any(map(wanted.matches, e.keys)))

    def matching(self, wanted: Wanted, kinds: Iterable[str]) -> dict[str, list[str]]:
        """Per kind, the names of the files that hold a wanted experiment."""
        return {kind: self.names(kind, wanted) for kind in kinds}

    def save(self) -> None:
        files = [{"kind": kind, "name": name, "size": e.size, "mtime_ns": e.mtime_ns, "keys": sorted(e.keys, key=_order)}
                 for (kind, name), e in sorted(self.entries.items())]
        self.file.write_atomic((json.dumps({"version": VERSION, "files": files}, separators=(",", ":")) + "\n").encode())


def _order(key: Key) -> tuple[str, ...]:
    return tuple(v or "" for v in key)
