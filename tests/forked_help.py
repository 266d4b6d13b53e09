"""``python -m MODULE [WORD] --help`` for many commands at once, as tests/test_readme.py checks them.

Run as ``python tests/forked_help.py '[["training", "train"], ["app.slides"]]'`` from the repository's root; prints
one JSON row per command: its argv, its exit status and the end of what it wrote to stderr.

Each command runs in a process of its own, forked from this one after it imported the heavy third-party libraries
(torch alone takes about 3 s of CPU to import, and the docs name over 40 commands): the fork imports the project's
modules afresh and runs the module as ``__main__`` as ``python -m`` does, so that a command that does not import
or does not parse ``--help`` still fails here. Two run at a time, as two cores allow.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import tempfile
import time
import traceback

import numpy  # noqa: F401  imported once, before the forks
import torch  # noqa: F401

TIMEOUT_S = 300  # a command's own limit, as when each ran as a subprocess
PARALLEL = 2


def _child(argv: list[str], stderr_fd: int) -> None:
    """In the fork: ``python -m argv[0] argv[1:] --help`` with stdout discarded and stderr to ``stderr_fd``."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(stderr_fd, 2)
    sys.argv = [argv[0], *argv[1:], "--help"]
    code = 0
    try:
        runpy.run_module(argv[0], run_name="__main__", alter_sys=True)
    except SystemExit as stop:  # what the interpreter makes of sys.exit(code)
        if stop.code is None:
            code = 0
        elif isinstance(stop.code, int):
            code = stop.code
        else:
            print(stop.code, file=sys.stderr)
            code = 1
    except BaseException:  # noqa: B036  the interpreter's own behaviour: the traceback, exit status 1
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run_all(commands: list[list[str]]) -> list[dict]:
    """Each command's argv, exit status and stderr's last 300 characters, in the order given."""
    sys.path[0] = os.getcwd()  # what ``python -m`` puts first: the working directory, not this file's folder
    waiting, running, done = list(enumerate(commands)), {}, {}
    while waiting or running:
        while waiting and len(running) < PARALLEL:
            index, argv = waiting.pop(0)
            stderr = tempfile.TemporaryFile()
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                _child(argv, stderr.fileno())
            running[pid] = (index, argv, stderr, time.monotonic())
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            for late, (_, _, _, started) in list(running.items()):
                if time.monotonic() - started > TIMEOUT_S:
                    os.kill(late, 9)
            time.sleep(0.02)
            continue
        index, argv, stderr, started = running.pop(pid)
        stderr.seek(0)
        said = stderr.read().decode(errors="replace")
        stderr.close()
        code = os.waitstatus_to_exitcode(status)
        if time.monotonic() - started > TIMEOUT_S:
            said += f"\n(killed after {TIMEOUT_S} s)"
        done[index] = {"argv": argv, "code": code, "stderr": said[-300:]}
    return [done[index] for index in range(len(commands))]


if __name__ == "__main__":
    for row in run_all(json.loads(sys.argv[1])):
        print(json.dumps(row))
