"""A BuildGrid server on 127.0.0.1 (CAS, action cache, execution) with one test worker.

BuildGrid 0.4.4 comes from .tools/buildgrid (bazel/setup_buildgrid.sh). Its scheduler keeps
jobs in PostgreSQL only, so a private cluster is made in a temporary directory (as the
`postgres` user when run as root: PostgreSQL refuses root) and removed afterwards. The worker
is remote_worker.py, run with BuildGrid's Python.
"""

from __future__ import annotations

import glob
import os
import pathlib
import shutil
import socket
import subprocess
import tempfile
import time

_CONFIG = """
server:
  - !channel
    address: "127.0.0.1:{port}"
    insecure-mode: true
authorization:
  method: none
connections:
  - !sql-connection &sql
    connection-string: {database}
storages:
  - !lru-storage &cas
    size: 1024MB
caches:
  - !lru-action-cache &cache
    storage: *cas
    max-cached-refs: 4096
    allow-updates: true
    cache-failed-actions: false
schedulers:
  - !sql-scheduler &scheduler
    sql: *sql
    storage: *cas
    action-cache: *cache
    property-set: !dynamic-property-set
      wildcard-property-keys: [container-image]
instances:
  - name: ""
    services:
      - !action-cache
        cache: *cache
      - !execution
        scheduler: *scheduler
      - !cas
        storage: *cas
      - !bytestream
        storage: *cas
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_port(port: int, process: subprocess.Popen, log: pathlib.Path, seconds: float):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"exited ({process.returncode}):\n{log.read_text()[-3000:]}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise RuntimeError(f"nothing listens on {port} after {seconds} s:\n{log.read_text()[-3000:]}")


class BuildGrid:
    """Use as a context manager; `url` is what Bazel's --remote_cache/--remote_executor take."""

    def __init__(self, repo: pathlib.Path, envs: pathlib.Path, journal: pathlib.Path):
        self.venv = repo / ".tools" / "buildgrid"
        self.worker_script = pathlib.Path(__file__).with_name("remote_worker.py")
        self.envs = envs
        self.journal = journal
        # PostgreSQL must reach its directory: under /tmp, not a test's private tmpdir.
        self.tmp = pathlib.Path(tempfile.mkdtemp(prefix="buildgrid-", dir="/tmp"))
        self.processes: list[subprocess.Popen] = []
        self.port = _free_port()
        self.url = f"grpc://127.0.0.1:{self.port}"

    def _as_postgres(self, *cmd: str) -> list[str]:
        return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else list(cmd)

    def _start_postgres(self) -> str:
        found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
        if not found:
            raise RuntimeError("no PostgreSQL: bazel/setup_buildgrid.sh installs it (./bazelw)")
        bindir = os.path.dirname(found[-1])
        data = self.tmp / "pg"
        data.mkdir()
        if os.geteuid() == 0:
            shutil.chown(self.tmp, "postgres")
            shutil.chown(data, "postgres")
        port = _free_port()
        subprocess.run(
            self._as_postgres(f"{bindir}/initdb", "-D", str(data), "-A", "trust", "-U", "bgd"),
            check=True,
            capture_output=True,
        )
        options = f"-p {port} -c listen_addresses=127.0.0.1 -c unix_socket_directories=''"
        subprocess.run(
            self._as_postgres(
                f"{bindir}/pg_ctl", "-D", str(data), "-o", options, "-l", str(data / "log"), "-w"
            )
            + ["start"],
            check=True,
            capture_output=True,
        )
        self._pg_stop = self._as_postgres(f"{bindir}/pg_ctl", "-D", str(data), "-m", "fast") + [
            "stop"
        ]
        return f"postgresql+psycopg2://bgd@127.0.0.1:{port}/postgres"

    def __enter__(self) -> "BuildGrid":
        try:
            database = self._start_postgres()
            bgd = str(self.venv / "bin" / "bgd")
            subprocess.run([bgd, "migrate", "apply", database], check=True, capture_output=True)
            config = self.tmp / "bgd.yml"
            config.write_text(_CONFIG.format(port=self.port, database=database))
            log = self.tmp / "bgd.log"
            with open(log, "wb") as out:
                server = subprocess.Popen(
                    [bgd, "server", "start", str(config)], stdout=out, stderr=subprocess.STDOUT
                )
            self.processes.append(server)
            _wait_for_port(self.port, server, log, 60)
            worker_log = self.tmp / "worker.log"
            with open(worker_log, "wb") as out:
                worker = subprocess.Popen(
                    [
                        str(self.venv / "bin" / "python3"),
                        "-P",  # not this directory first on sys.path: BuildGrid's own modules
                        str(self.worker_script),
                        f"--server=127.0.0.1:{self.port}",
                        f"--envs={self.envs}",
                        f"--workdir={self.tmp / 'work'}",
                        f"--journal={self.journal}",
                    ],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            self.processes.append(worker)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def logs(self) -> str:
        return "".join(
            f"--- {p.name} ---\n{p.read_text(errors='replace')[-4000:]}\n"
            for p in (self.tmp / "bgd.log", self.tmp / "worker.log")
            if p.exists()
        )

    def __exit__(self, *exc) -> None:
        for process in reversed(self.processes):
            process.terminate()
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
        if hasattr(self, "_pg_stop"):
            subprocess.run(self._pg_stop, capture_output=True)
        shutil.rmtree(self.tmp, ignore_errors=True)
