"""A pyarrow filesystem that counts what is opened: how tests and benchmarks see which Parquet files
a read really touches (the local filesystem underneath, nothing else changed)."""

from __future__ import annotations

from typing import Any

import pyarrow.fs as pafs


class Counting(pafs.FileSystemHandler):
    """The local filesystem, remembering every file opened for reading."""

    def __init__(self) -> None:
        self.fs = pafs.LocalFileSystem()
        self.opened: list[str] = []

    def parquet(self) -> set[str]:
        return {p for p in self.opened if p.endswith(".parquet")}

    def get_type_name(self) -> str:
        return "counting"

    def normalize_path(self, path: str) -> str:
        return path

    def get_file_info(self, paths: list[str]) -> list[pafs.FileInfo]:
        return self.fs.get_file_info(paths)  # type: ignore[no-any-return]

    def get_file_info_selector(self, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
        return self.fs.get_file_info(selector)  # type: ignore[no-any-return]

    def create_dir(self, path: str, recursive: bool) -> None:
        self.fs.create_dir(path, recursive=recursive)

    def delete_dir(self, path: str) -> None:
        self.fs.delete_dir(path)

    def delete_dir_contents(self, path: str, missing_dir_ok: bool = False) -> None:
        self.fs.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self) -> None:
        raise OSError("not here")

    def delete_file(self, path: str) -> None:
        self.fs.delete_file(path)

    def move(self, src: str, dest: str) -> None:
        self.fs.move(src, dest)

    def copy_file(self, src: str, dest: str) -> None:
        self.fs.copy_file(src, dest)

    def open_input_stream(self, path: str) -> Any:
        self.opened.append(path)
        return self.fs.open_input_stream(path)

    def open_input_file(self, path: str) -> Any:
        self.opened.append(path)
        return self.fs.open_input_file(path)

    def open_output_stream(self, path: str, metadata: Any) -> Any:
        return self.fs.open_output_stream(path, metadata=metadata)

    def open_append_stream(self, path: str, metadata: Any) -> Any:
        return self.fs.open_append_stream(path, metadata=metadata)
