"""A PostgreSQL server of a test's own, which the test stops and starts mid-run: the database going
away under a running daemon (``test_write_path.py``'s journal, ``test_ui.py``'s journal flag).
The fixture ``own_postgres`` (``conftest.py``) starts one for a test and removes it after."""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest


class OwnPostgres:
    """A PostgreSQL server of the test's own (``initdb`` into a temporary folder, a free port),
    which the test stops and starts; run as the ``postgres`` user when the tests run as root."""

    def __init__(self) -> None:
        found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
        if not found:
            pytest.skip("no PostgreSQL server binaries (/usr/lib/postgresql/*/bin/initdb): apt-get install postgresql")
        self.bin = Path(found[-1]).parent
        self.user: list[str] = []
        self.dir = Path(tempfile.mkdtemp(prefix="tidegate-pg-"))
        if os.geteuid() == 0:
            try:
                pw = pwd.getpwnam("postgres")
            except KeyError:
                pytest.skip("running as root without a 'postgres' user to run the server as")
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
            self.user = ["runuser", "-u", "postgres", "--"]
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self._run("initdb", "-D", str(self.dir / "data"), "-U", "postgres", "-A", "trust")
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres?connect_timeout=3"

    def _run(self, tool: str, *args: str) -> None:
        subprocess.run([*self.user, str(self.bin / tool), *args], check=True, capture_output=True, timeout=120)

    def start(self) -> None:
        self._run("pg_ctl", "-D", str(self.dir / "data"), "-w", "-l", str(self.dir / "log"), "-o",
                  f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off", "start")

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.dir / "data"), "-w", "-m", "immediate", "stop")

    def close(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):
            self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
