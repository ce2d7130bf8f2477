"""A TCP proxy between a client and Postgres that can cut connections on cue.

Used to produce the faults a real network produces: a connection that dies
after the server committed but before the client heard back.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import Any

from psycopg.conninfo import conninfo_to_dict, make_conninfo


class FaultProxy:
    """Listens on 127.0.0.1:<port> and forwards to the server of `dsn`."""

    def __init__(self, dsn: str) -> None:
        params: dict[str, Any] = conninfo_to_dict(dsn)
        host = str(params.get("host") or "127.0.0.1")
        port = int(params.get("port") or 5432)
        self._target: tuple[int, Any] = (
            (socket.AF_UNIX, f"{host}/.s.PGSQL.{port}")
            if host.startswith("/")
            else (socket.AF_INET, (host, port))
        )
        params.update(host="127.0.0.1", sslmode="disable")
        self._listener = socket.create_server(("127.0.0.1", 0))
        params["port"] = self._listener.getsockname()[1]
        self.dsn = make_conninfo("", **params)
        self._lock = threading.Lock()
        self._cut_on: bytes | None = None
        self.cuts = 0
        self._conns: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def cut_after_request_containing(self, marker: bytes) -> None:
        """Next time a client sends `marker`, deliver it, then drop the server's reply."""
        with self._lock:
            self._cut_on = marker

    def close(self) -> None:
        """Stop listening and cut every connection."""
        _close(self._listener)
        with self._lock:
            self._closed = True
            for s in self._conns:
                _close(s)

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.socket(self._target[0], socket.SOCK_STREAM)
            server.connect(self._target[1])
            with self._lock:
                if self._closed:  # accepted just as the proxy closed: cut it too
                    _close(client)
                    _close(server)
                    return
                self._conns += [client, server]
            pair = _Pair(client, server, self)
            threading.Thread(target=pair.upstream, daemon=True).start()
            threading.Thread(target=pair.downstream, daemon=True).start()

    def _should_cut(self, chunk: bytes) -> bool:
        with self._lock:
            if self._cut_on is not None and self._cut_on in chunk:
                self._cut_on = None
                self.cuts += 1
                return True
            return False


class _Pair:
    def __init__(self, client: socket.socket, server: socket.socket, proxy: FaultProxy) -> None:
        self.client, self.server, self.proxy = client, server, proxy
        self.cut = threading.Event()

    def upstream(self) -> None:
        try:
            while data := _recv(self.client):
                if self.proxy._should_cut(data):
                    self.cut.set()
                    self.server.sendall(data)
                    # Let the server execute and commit, then lose its answer.
                    threading.Timer(0.3, self._close).start()
                    return
                self.server.sendall(data)
        except OSError:
            pass
        self._close()

    def downstream(self) -> None:
        while (data := _recv(self.server)) and not self.cut.is_set():
            try:
                self.client.sendall(data)
            except OSError:
                break
        if not self.cut.is_set():
            self._close()

    def _close(self) -> None:
        _close(self.client)
        _close(self.server)


def _recv(s: socket.socket) -> bytes:
    try:
        return s.recv(65536)
    except OSError:
        return b""


def _close(s: socket.socket) -> None:
    with contextlib.suppress(OSError):
        s.shutdown(socket.SHUT_RDWR)
    s.close()
