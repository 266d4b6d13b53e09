"""A real Dask cluster for tests: ``dask scheduler`` and ``dask worker`` processes on 127.0.0.1 only, each in its
own process group, killed as a group (nanny, worker and anything they started) when the test is done, pass or fail,
and checked gone."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import REPO

__all__ = ["DaskProcesses", "group_alive", "wait_for"]

START_TIMEOUT = 60  # seconds for a scheduler to write its file, or workers to register


def wait_for(condition, timeout: float, what: str, step: float = 0.05):
    """``condition()``'s first true value within ``timeout`` seconds; else an AssertionError naming ``what``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := condition():
            return value
        time.sleep(step)
    raise AssertionError(f"{what}: not within {timeout} s")


def group_alive(group: int) -> list[int]:
    """The processes of process group ``group`` still running (zombies, already dead, are not counted)."""
    alive = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == group and fields[0] != "Z":
            alive.append(int(stat.parent.name))
    return alive


class DaskProcesses:
    """Scheduler and worker processes started by the test, their logs under ``folder``."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.processes: list[subprocess.Popen] = []
        self.scheduler: subprocess.Popen | None = None
        self.address: str | None = None
        self.workers = 0

    def _start(self, name: str, *args: str) -> subprocess.Popen:
        log = (self.folder / f"{name}-{len(self.processes)}.log").open("wb")
        # The project on the path: a task names its function by module (app.slides.cohort).
        env = dict(os.environ, PYTHONPATH=str(REPO))
        process = subprocess.Popen([sys.executable, "-m", "dask", name, *args], cwd=REPO, env=env, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        self.processes.append(process)
        return process

    def start_scheduler(self) -> str:
        """A scheduler on 127.0.0.1 at a free port; returns its address."""
        file = self.folder / f"scheduler-{len(self.processes)}.json"
        self.scheduler = self._start("scheduler", "--host", "127.0.0.1", "--port", "0", "--scheduler-file",
                                     str(file), "--no-dashboard")

        def address():
            try:
                return json.loads(file.read_text())["address"]
            except (OSError, ValueError, KeyError):
                return None

        self.address = wait_for(address, START_TIMEOUT, "the scheduler's address")
        return self.address

    def start_workers(self, count: int) -> None:
        """``count`` worker processes of one thread each (each under its nanny), registered with the scheduler."""
        from dask.distributed import Client

        self.workers += count
        for _ in range(count):
            self._start("worker", self.address, "--nthreads", "1", "--nworkers", "1", "--host", "127.0.0.1",
                        "--no-dashboard", "--local-directory", str(self.folder / "space"))
        with Client(self.address, timeout="20s") as client:
            client.wait_for_workers(self.workers, timeout=START_TIMEOUT)

    def kill_scheduler(self) -> None:
        self._kill(self.scheduler)

    def _kill(self, process: subprocess.Popen) -> None:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait(timeout=30)

    def close(self) -> None:
        """Every process group killed; raises AssertionError if any of their processes is still there after 30 s."""
        for process in self.processes:
            self._kill(process)
        for process in self.processes:
            wait_for(lambda group=process.pid: not group_alive(group), 30, f"process group {process.pid} gone")
