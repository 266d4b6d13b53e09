"""Connecting to Dask is bounded and said in one sentence, and the local cluster lets no one else in (issue 66).

The bad schedulers are tiny socket servers made here: one that accepts and says nothing, one that answers junk.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time

import dask
import pytest

from app.slides.connection import TLS_SETTINGS, SchedulerUnreachable, connect

pytest.importorskip("dask.distributed")

DEADLINE_S = 2.0
BOUND_S = DEADLINE_S + 8  # generous on 2 busy cores; the silent listener held Dask's own client for over 150 s


class Listener:
    """A TCP server on 127.0.0.1 that accepts every connection and then ``answer``s with bytes, or stays silent."""

    def __init__(self, answer: bytes | None = None):
        self.server = socket.create_server(("127.0.0.1", 0))
        self.address = f"tcp://127.0.0.1:{self.server.getsockname()[1]}"
        self.answer, self.held = answer, []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                peer, _ = self.server.accept()
            except OSError:
                return
            self.held.append(peer)  # kept open: a silent peer, not a closed one
            if self.answer is not None:
                peer.sendall(self.answer)

    def close(self) -> None:
        self.server.close()
        for peer in self.held:
            peer.close()


@pytest.fixture
def listener(request):
    made = Listener(request.param)
    yield made
    made.close()


def refused(address: str) -> tuple[str, float]:
    """What :func:`connect` says of ``address``, and how long it took to say it."""
    started = time.monotonic()
    with pytest.raises(SchedulerUnreachable) as caught:
        connect(address, deadline_s=DEADLINE_S)
    return str(caught.value), time.monotonic() - started


@pytest.mark.parametrize("listener", [None], indirect=True)
def test_a_silent_listener_cannot_stretch_the_deadline(listener):
    said, seconds = refused(listener.address)
    assert said == (f"no Dask scheduler answers at {listener.address}: it accepted the connection but said nothing "
                    f"within {DEADLINE_S:g} s (not a Dask scheduler, or a network that drops its answers)")
    assert seconds < BOUND_S


@pytest.mark.parametrize("listener", [b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n" * 64], indirect=True)
def test_junk_from_the_scheduler_is_a_sentence(listener):
    said, seconds = refused(listener.address)
    assert said.startswith(f"no Dask scheduler answers at {listener.address}: what answers there does not speak "
                           "Dask's protocol (")
    assert "\n" not in said and "Traceback" not in said
    assert seconds < BOUND_S


def test_a_wrong_scheme_is_a_sentence():
    said, _ = refused("http://127.0.0.1:8786")
    assert said == ("no Dask scheduler answers at http://127.0.0.1:8786: http:// is not a Dask scheduler's scheme; "
                    "name it as tls://HOST:PORT, or tcp://HOST:PORT on a trusted network only")


def test_tls_without_dask_configuration_is_a_sentence():
    with dask.config.set({"distributed.comm.tls.ca-file": None, "distributed.comm.tls.client.cert": None}):
        said, _ = refused("tls://127.0.0.1:8786")
    assert said == (f"no Dask scheduler answers at tls://127.0.0.1:8786: tls:// needs Dask's TLS settings "
                    f"({', '.join(TLS_SETTINGS)}), and none are set")


def test_nothing_listening_and_an_unknown_host_are_sentences():
    closed = socket.create_server(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    said, seconds = refused(f"tcp://127.0.0.1:{port}")
    assert said == f"no Dask scheduler answers at tcp://127.0.0.1:{port}: nothing listens there (connection refused)"
    assert seconds < BOUND_S
    said, _ = refused("tcp://no-such-host.invalid:8786")
    assert said == ("no Dask scheduler answers at tcp://no-such-host.invalid:8786: the host no-such-host.invalid is "
                    "not known")


# Run in a process of its own, as a stranger on the machine would: it knows the scheduler's address, not its
# credentials. Each attempt, had it connected, would have run a function on a worker that writes a file.
_STRANGER = """
import json, os, sys
from dask.distributed import Client
from distributed.security import Security
address, marker = sys.argv[1], sys.argv[2]
def leave_a_mark():
    open(marker, "w").write(str(os.getpid()))
outcomes = {}
for name, target, security in (("tls, no credentials", address, None),
                               ("tcp, no credentials", address.replace("tls://", "tcp://"), None),
                               ("tls, credentials of its own", address, Security.temporary())):
    try:
        client = Client(target, security=security, timeout="3s")
        client.run(leave_a_mark)
        client.submit(leave_a_mark).result(timeout=10)
        outcomes[name] = "ran"
    except Exception as err:
        outcomes[name] = type(err).__name__
print(json.dumps(outcomes))
"""


def test_the_local_cluster_refuses_a_process_without_its_credentials(tmp_path):
    from app.slides.run import close_client, local_client

    client = local_client(workers=1, threads=1)
    try:
        address = client.scheduler.address
        assert address.startswith("tls://127.0.0.1:")
        assert client.submit(os.getpid).result(timeout=60) != os.getpid()  # its own client runs tasks
        marker = tmp_path / "ran_here"
        done = subprocess.run([sys.executable, "-c", _STRANGER, address, str(marker)], capture_output=True,
                              text=True, timeout=120)
        outcomes = json.loads(done.stdout.strip().splitlines()[-1])
        assert set(outcomes) == {"tls, no credentials", "tcp, no credentials", "tls, credentials of its own"}
        assert "ran" not in outcomes.values(), outcomes
        print("a stranger's attempts:", outcomes)
        assert not marker.exists()
        assert client.run(os.getpid)  # and the cluster still serves its own client
        # Whoever holds the credentials, as files named by Dask's TLS settings, connects through tls://.
        security = client.security
        for name, pem in (("ca.pem", security.tls_ca_file), ("cert.pem", security.tls_client_cert),
                          ("key.pem", security.tls_client_key)):
            (tmp_path / name).write_text(pem)
        with dask.config.set({"distributed.comm.tls.ca-file": str(tmp_path / "ca.pem"),
                              "distributed.comm.tls.client.cert": str(tmp_path / "cert.pem"),
                              "distributed.comm.tls.client.key": str(tmp_path / "key.pem")}):
            trusted = connect(address)
        try:
            assert trusted.submit(os.getpid).result(timeout=60) != os.getpid()
        finally:
            trusted.close()
    finally:
        close_client(client)


def test_the_servers_shutdown_never_waits_for_a_connection_being_made(monkeypatch):
    import app.slides.connection as connection

    silent = Listener()
    monkeypatch.setenv("AAGC_DASK_SCHEDULER", silent.address)
    monkeypatch.setattr(connection, "CONNECT_DEADLINE_S", DEADLINE_S)
    try:
        connecting = connection.server_connecting()
        started = time.monotonic()
        connection.close_server_clients()  # while the client still waits for the silent listener
        assert time.monotonic() - started < 1.0 and not connecting.done()
        with pytest.raises(SchedulerUnreachable) as caught:
            connection.server_client()  # a new attempt, bounded by the deadline
        assert str(caught.value).startswith(f"no Dask scheduler answers at {silent.address}: it accepted the "
                                            f"connection but said nothing within {DEADLINE_S:g} s")
        assert connection.server_connecting() is not connecting  # a failed connection is tried again
    finally:
        connection.close_server_clients()
        silent.close()
