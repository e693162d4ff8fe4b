"""A local Ray cluster whose worker nodes cannot see the driver's disk.

The head runs here (no CPUs, no GPUs: no group ever runs on it) with the job server. Each worker
node is a `ray start --block` inside its own mount namespace (`unshare --mount`), where tmpfs
mounts hide the folders the test names (the driver's runs dir, matrix dir and caches) and HOME is a
fresh folder: a worker that reads a driver path finds nothing there. Each has a host name of its own
too (`--uts`), so rows say which node ran them. Every node runs in a process
group of its own, which is how a test kills one (a lost node) and how everything is stopped.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import psutil

from sweeper.execute.ray_executor import kill_processes_using

BIN = Path(sys.executable).parent
MARKER = "SWEEP_TEST_CLUSTER"  # in the environment of every process of one such cluster
STORE_BYTES = 100 * 2**20
# Node death found in ~2 s rather than Ray's default ~30 s.
FAST_HEALTH = {"RAY_health_check_period_ms": "500", "RAY_health_check_timeout_ms": "1000",
               "RAY_health_check_failure_threshold": "3", "RAY_health_check_initial_delay_ms": "0"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def unshare_refused() -> str | None:
    """Why worker nodes cannot get their own mount namespace here, or None when they can."""
    if shutil.which("unshare") is None:
        return "unshare is not installed"
    probe = subprocess.run(["unshare", "--mount", "--uts", "--propagation", "private", "sh", "-c",
                            "mount -t tmpfs tmpfs /mnt && hostname sweep-probe"], capture_output=True, text=True,
                           check=False)
    if probe.returncode != 0:
        return f"unshare --mount --uts with a tmpfs mount is refused: {probe.stderr.strip()[:200]}"
    return None


class NamespacedCluster:
    def __init__(self, hide: Sequence[Path], workdir: Path) -> None:
        self.hide = [Path(p) for p in hide]
        self.workdir = workdir
        self.token = secrets.token_hex(4)
        self.port = free_port()
        self.dashboard_port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.dashboard = f"http://127.0.0.1:{self.dashboard_port}"
        self.nodes: dict[str, subprocess.Popen[bytes]] = {}
        self.commands: dict[str, tuple[list[str], dict[str, str]]] = {}
        self.temps: list[str] = []
        self.env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
                    "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0", MARKER: self.token,
                    "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", **FAST_HEALTH}
        self.env.pop("RAY_ADDRESS", None)
        # uv's own package cache (not ours): installs on worker nodes need no network.
        uv = shutil.which("uv")
        if uv and "UV_CACHE_DIR" not in self.env:
            out = subprocess.run([uv, "cache", "dir"], capture_output=True, text=True, check=False).stdout.strip()
            if out:
                self.env["UV_CACHE_DIR"] = out

    def _temp(self, name: str) -> str:
        path = f"/tmp/r-{self.token}{name}"  # short: Ray's socket paths must stay under 107 bytes
        self.temps.append(path)
        return path

    def _start(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        self.commands[name] = (argv, env)
        log = open(self.workdir / f"{name}.log", "ab")  # noqa: SIM115  (the node's own output, kept for triage)
        self.nodes[name] = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()

    def start_head(self) -> None:
        argv = [str(BIN / "ray"), "start", "--head", "--block", "--port", str(self.port),
                "--node-ip-address", "127.0.0.1", "--num-cpus", "0", "--num-gpus", "0",
                "--temp-dir", self._temp("h"), "--object-store-memory", str(STORE_BYTES),
                "--include-dashboard", "true", "--dashboard-host", "127.0.0.1",
                "--dashboard-port", str(self.dashboard_port), "--ray-client-server-port", str(free_port()),
                "--dashboard-agent-listen-port", str(free_port())]
        self._start("head", argv, self.env)

    def hostname(self, name: str) -> str:
        return f"sweep-{name}-{self.token}"

    def add_worker(self, name: str, gpus: int = 2) -> None:
        home = self.workdir / f"home-{name}"  # inside a hidden folder: exists only in that namespace
        mounts = " && ".join(f"mount -t tmpfs tmpfs {shlex.quote(str(p))}" for p in self.hide)
        ray = [str(BIN / "ray"), "start", "--block", "--address", self.address, "--node-ip-address", "127.0.0.1",
               "--num-cpus", "1", "--num-gpus", str(gpus), "--temp-dir", self._temp(name),
               "--object-store-memory", str(STORE_BYTES), "--dashboard-agent-listen-port", str(free_port()),
               "--resources", f'{{"node-{name}": 1}}']
        script = (f"hostname {self.hostname(name)} && {mounts} && mkdir -p {shlex.quote(str(home))} && "
                  f"exec {shlex.join(ray)}")
        self._start(name, ["unshare", "--mount", "--uts", "--propagation", "private", "sh", "-c", script],
                    {**self.env, "HOME": str(home)})

    def wait_nodes(self, n: int, timeout: float = 180.0, restarts: int = 2) -> None:
        """Until `n` nodes are alive (the head counts), asked by one short-lived driver. A worker node
        that gives up while joining (on a busy machine Ray's 30 s startup deadline can pass) is started
        again, `restarts` times at most."""
        proc = subprocess.Popen([str(BIN / "python"), "-c", _WAIT_NODES, self.address, str(n), str(timeout)],
                                env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            deadline = time.monotonic() + timeout + 30
            while proc.poll() is None:
                for name, node in list(self.nodes.items()):
                    if node.poll() is not None:
                        if name == "head" or restarts <= 0:
                            log = (self.workdir / f"{name}.log").read_text()[-2000:]
                            raise RuntimeError(f"node {name} exited: {log}")
                        restarts -= 1
                        with contextlib.suppress(ProcessLookupError):
                            os.killpg(node.pid, signal.SIGKILL)  # what the failed start left
                        self._start(name, *self.commands[name])
                if time.monotonic() > deadline:
                    raise TimeoutError(f"fewer than {n} nodes after {timeout:.0f}s")
                time.sleep(0.2)
            out = proc.stdout.read() if proc.stdout else ""
            if proc.returncode != 0:
                raise RuntimeError(f"waiting for {n} nodes: {out[-2000:]}")
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    def namespace(self, name: str) -> str:
        return os.readlink(f"/proc/{self.nodes[name].pid}/ns/mnt")

    def kill(self, name: str) -> None:
        """Lose a node: SIGKILL its whole process group (the raylet and everything it started)."""
        proc = self.nodes.pop(name)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    def close(self) -> None:
        for name in list(self.nodes)[::-1]:
            self.kill(name)
        for temp in self.temps:  # Ray processes that left the node's group (workers, agents)
            kill_processes_using(temp)
            shutil.rmtree(temp, ignore_errors=True)

    def processes(self) -> list[psutil.Process]:
        """This cluster's live processes (they carry its marker in their environment)."""
        out = []
        for proc in psutil.process_iter(["pid"]):
            try:
                if proc.environ().get(MARKER) == self.token:
                    out.append(proc)
            except psutil.Error:
                continue
        return out

    def servers(self) -> list[psutil.Process]:
        """Server processes (and their guards) this cluster's workers started, on any node."""
        out = []
        for proc in self.processes():
            with contextlib.suppress(psutil.Error):
                cmd = proc.cmdline()
                if "serve" in cmd and ("vllmsim" in cmd or any(c.endswith("/vllm") for c in cmd)):
                    out.append(proc)
        return out

    def wait_no_servers(self, timeout: float = 60.0) -> list[psutil.Process]:
        # A lost node's guards stop their servers with a grace period; on a loaded machine that takes a while.
        deadline = time.monotonic() + timeout
        while (left := self.servers()) and time.monotonic() < deadline:
            time.sleep(0.2)
        return left


_WAIT_NODES = """
import sys, time, ray
address, n, timeout = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
deadline = time.monotonic() + timeout
while True:
    try:
        ray.init(address=address, log_to_driver=False, configure_logging=False)
        break
    except Exception:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.5)
while sum(1 for node in ray.nodes() if node["Alive"]) < n:
    if time.monotonic() > deadline:
        sys.exit(f"fewer than {n} nodes")
    time.sleep(0.2)
"""
