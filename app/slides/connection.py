"""Connections to Dask, bounded in time and said in one sentence: the command's (``--scheduler``) and the server's.

A scheduler is named by ``tcp://HOST:PORT`` (plain: unauthenticated and unencrypted, for trusted networks only) or
``tls://HOST:PORT`` with Dask's own TLS settings (``DASK_DISTRIBUTED__COMM__TLS__CA_FILE``, ``..._CLIENT__CERT``,
``..._CLIENT__KEY``; docs/slides.md). Without a name, a local cluster starts (:func:`app.slides.run.local_client`),
with temporary TLS credentials that only this process holds.

Connecting has a hard deadline (:data:`CONNECT_DEADLINE_S`) that no listener can stretch: Dask's own ``timeout``
does not bound its handshake (a listener that accepts and stays silent held ``Client(address, timeout="10s")`` for
over 150 s here), so the client is made in a daemon thread and waited for with a timeout; one that connects after
its deadline is closed. Every failure is a :class:`SchedulerUnreachable`, an ``OSError`` whose message is one
sentence naming the address. The server's connection is made in the background from the first look at a slide
(:func:`server_connecting`), and its shutdown (:func:`close_server_clients`) never waits for one still being made.
"""

from __future__ import annotations

import importlib
import os
import socket
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout

from .run import SCHEDULER_ENV, close_client, local_client

__all__ = ["SchedulerUnreachable", "connect", "scheduler_address", "server_connecting", "server_client",
           "close_server_clients", "CONNECT_DEADLINE_S", "LOCAL_START_DEADLINE_S", "TLS_SETTINGS"]

CONNECT_DEADLINE_S = 10.0  # a named scheduler answers within this, or is said not to
# A local cluster spawns a worker process that imports PyTorch: 3-8 s on 2 busy cores, so well above that.
LOCAL_START_DEADLINE_S = 120.0
SCHEMES = ("tcp", "tls")
TLS_SETTINGS = ("DASK_DISTRIBUTED__COMM__TLS__CA_FILE", "DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT",
                "DASK_DISTRIBUTED__COMM__TLS__CLIENT__KEY")


class SchedulerUnreachable(OSError):
    """No usable Dask scheduler at an address; the message is one sentence naming it.

    Attributes:
        address: the scheduler's address as given ("" for the local cluster).
        reason: why, without the address (e.g. ``"nothing listens there (connection refused)"``).
    """

    def __init__(self, address: str, reason: str):
        where = f"at {address}" if address else "(the local cluster)"
        super().__init__(f"no Dask scheduler answers {where}: {reason}")
        self.address, self.reason = address, reason


def scheduler_address() -> str | None:
    """The scheduler ``$AAGC_DASK_SCHEDULER`` names, or None (a local cluster)."""
    return os.environ.get(SCHEDULER_ENV) or None


def connect(address: str, deadline_s: float | None = None):
    """A ``dask.distributed.Client`` on the scheduler at ``address``, within ``deadline_s`` (default
    :data:`CONNECT_DEADLINE_S`) whatever answers there.

    Raises:
        SchedulerUnreachable: a wrong scheme, ``tls://`` without Dask's TLS settings, a host that does not
            resolve, nothing listening, a listener that says nothing or does not speak Dask's protocol.
    """
    deadline_s = CONNECT_DEADLINE_S if deadline_s is None else deadline_s
    started = time.monotonic()
    host, port = _checked(address)
    _probe(address, host, port, deadline_s)
    left_s = max(deadline_s - (time.monotonic() - started), 0.5)  # the probe's time is the deadline's
    made: Future = Future()

    def attempt() -> None:
        from dask.distributed import Client

        try:
            made.set_result(Client(address, timeout=f"{left_s}s"))
        except BaseException as err:  # noqa: BLE001  (handed to the waiting thread, which says it)
            made.set_exception(err)

    threading.Thread(target=attempt, name="dask-connect", daemon=True).start()
    try:
        return made.result(timeout=left_s)
    except FutureTimeout:
        made.add_done_callback(_close_late)  # a client that connects after all is not left open
        raise SchedulerUnreachable(address, f"it accepted the connection but said nothing within {deadline_s:g} s "
                                            "(not a Dask scheduler, or a network that drops its answers)") from None
    except OSError as err:
        raise SchedulerUnreachable(address, f"the connection failed ({_first_line(err)})") from None
    except Exception as err:
        raise SchedulerUnreachable(address, f"what answers there does not speak Dask's protocol "
                                            f"({type(err).__name__}: {_first_line(err)})") from None


def _checked(address: str) -> tuple[str, int]:
    """The host and port of a ``tcp://`` or ``tls://`` address (no scheme: tcp), ``tls://`` only with Dask's TLS
    settings; else :class:`SchedulerUnreachable`."""
    from distributed.comm.addressing import parse_host_port
    from distributed.security import Security

    scheme, _, location = address.rpartition("://")
    scheme = scheme or "tcp"
    if scheme not in SCHEMES:
        raise SchedulerUnreachable(address, f"{scheme}:// is not a Dask scheduler's scheme; name it as "
                                            "tls://HOST:PORT, or tcp://HOST:PORT on a trusted network only")
    if scheme == "tls":
        security = Security()  # Dask's configuration: its files, or DASK_DISTRIBUTED__COMM__TLS__* variables
        if not (security.tls_ca_file and security.tls_client_cert):
            raise SchedulerUnreachable(address, f"tls:// needs Dask's TLS settings ({', '.join(TLS_SETTINGS)}), "
                                                "and none are set")
    try:
        return parse_host_port(location)
    except ValueError:
        raise SchedulerUnreachable(address, "it is not HOST:PORT after the scheme") from None


def _probe(address: str, host: str, port: int, deadline_s: float) -> None:
    """Said at once where nothing listens or the host does not resolve (Dask's client would retry those until its
    timeout)."""
    try:
        socket.create_connection((host, port), timeout=min(deadline_s, 5.0)).close()
    except socket.gaierror:
        raise SchedulerUnreachable(address, f"the host {host} is not known") from None
    except ConnectionRefusedError:
        raise SchedulerUnreachable(address, "nothing listens there (connection refused)") from None
    except TimeoutError:
        raise SchedulerUnreachable(address, f"no connection within {min(deadline_s, 5.0):g} s") from None
    except OSError as err:
        raise SchedulerUnreachable(address, f"the connection failed ({err.strerror or err})") from None


def _close_late(made: Future) -> None:
    if made.exception() is None:
        made.result().close()


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0][:200] if text else type(err).__name__


_CONNECTIONS: dict[str | None, Future] = {}  # scheduler address (None: the local cluster) -> the client, connecting
_LOCK = threading.Lock()


def _server_connect(address: str | None):
    """The server's client: on the named scheduler, or on a local cluster it starts (with TLS credentials of its
    own). Each worker imports the engine (PyTorch with it) now, not when the first chunk comes: 1.1 s sooner."""
    client = connect(address) if address else local_client(workers=1, threads=2)
    client.run(importlib.import_module, "app.slides.run")
    return client


def server_connecting() -> Future:
    """The server's Dask client for ``$AAGC_DASK_SCHEDULER`` (or its local cluster), connected in a daemon thread from
    the first time a slide can be analysed: a local cluster takes seconds to start, which the user spends looking at
    the slide, not after asking for an analysis. A server whose scheduler is changed connects anew."""
    address = scheduler_address()
    with _LOCK:
        if address not in _CONNECTIONS:
            made: Future = Future()

            def attempt() -> None:
                try:
                    made.set_result(_server_connect(address))
                except BaseException as err:  # noqa: BLE001  (kept in the future, said by whoever asks)
                    made.set_exception(err)

            threading.Thread(target=attempt, name="dask-client", daemon=True).start()
            _CONNECTIONS[address] = made
        return _CONNECTIONS[address]


def server_client():
    """The server's Dask client, waiting a bounded time for its connection if it is still being made.

    Raises:
        SchedulerUnreachable: the scheduler could not be reached (the next call tries again), or the local cluster
            has not started within :data:`LOCAL_START_DEADLINE_S` (it goes on starting).
    """
    address = scheduler_address()
    connecting = server_connecting()
    try:
        # A named scheduler's attempt ends by its own deadline; the margin covers the workers' imports after it.
        return connecting.result(timeout=CONNECT_DEADLINE_S * 2 if address else LOCAL_START_DEADLINE_S)
    except FutureTimeout:
        raise SchedulerUnreachable(address or "", "its workers are still starting; try again in a moment") from None
    except Exception as err:
        with _LOCK:  # the next call tries again
            if _CONNECTIONS.get(address) is connecting:
                del _CONNECTIONS[address]
        if isinstance(err, SchedulerUnreachable):
            raise
        raise SchedulerUnreachable(address or "", f"{type(err).__name__}: {_first_line(err)}") from None


def close_server_clients() -> None:
    """Close the server's Dask clients, and the local cluster it started, where any (``app/server.py``, when the
    server stops). One still connecting is closed when it connects, in its own thread: this never waits for it."""
    with _LOCK:
        connections = list(_CONNECTIONS.values())
        _CONNECTIONS.clear()
    for connecting in connections:
        connecting.add_done_callback(_close_made)


def _close_made(made: Future) -> None:
    if made.exception() is None:
        close_client(made.result())  # and the local cluster, where this server started one
