"""A real S3 endpoint on 127.0.0.1: moto's standalone server, started and stopped by the test that
uses it (the clients stay the real pyarrow ones; nothing is patched)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pyarrow.fs as pafs

BUCKET = "sweep-test"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
               "AWS_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}


def moto_server() -> str | None:
    return shutil.which("moto_server", path=str(Path(sys.executable).parent)) or shutil.which("moto_server")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def moto_s3(server: str) -> Iterator[dict[str, str]]:
    """A moto S3 server with one bucket, `BUCKET`; yields the environment that points a client at it
    (credentials and AWS_ENDPOINT_URL) plus its `port`. The environment is also set in this process
    while it runs."""
    port = _free_port()
    proc = subprocess.Popen([server, "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    env = {**CREDENTIALS, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}"}
    saved = {k: os.environ.get(k) for k in env}
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/moto-api/", timeout=1).close()
                break
            except OSError:
                assert proc.poll() is None, "moto_server exited"
                assert time.monotonic() < deadline, "moto_server did not answer in 30 s"
                time.sleep(0.1)
        os.environ.update(env)
        fs = pafs.S3FileSystem(endpoint_override=f"127.0.0.1:{port}", scheme="http", access_key="testing",
                               secret_key="testing", region="us-east-1", allow_bucket_creation=True)
        fs.create_dir(BUCKET)
        yield {**env, "port": str(port)}
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def s3fs(s3: dict[str, str]) -> pafs.S3FileSystem:
    """pyarrow's own S3 filesystem, configured by hand (not through sweeper)."""
    return pafs.S3FileSystem(endpoint_override=f"127.0.0.1:{s3['port']}", scheme="http", access_key="testing",
                             secret_key="testing", region="us-east-1")


def names(fs: pafs.S3FileSystem, path: str) -> list[str]:
    return sorted(i.base_name for i in fs.get_file_info(pafs.FileSelector(path, allow_not_found=True)))
