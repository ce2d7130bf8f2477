"""A TCP proxy between a client and Postgres that can cut or stall connections on cue.

Used to produce the faults a real network produces: a connection that dies
after the server committed but before the client heard back, every connection
cut at once, or a link that stops carrying bytes for a while.
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
        self._pairs: list[_Pair] = []
        self._flowing = threading.Event()
        self._flowing.set()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def cut_after_request_containing(self, marker: bytes) -> None:
        """Next time a client sends `marker`, deliver it, then drop the server's reply."""
        with self._lock:
            self._cut_on = marker

    def cut_all(self) -> int:
        """Cut every open connection at once; how many were cut."""
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for pair in pairs:
            pair.close()
        return len(pairs)

    def stall(self, seconds: float) -> None:
        """Stop carrying bytes either way for `seconds`; connections stay open."""
        self._flowing.clear()
        threading.Timer(seconds, self._flowing.set).start()

    @property
    def open_connections(self) -> int:
        """Connections currently proxied."""
        with self._lock:
            self._pairs = [p for p in self._pairs if not p.closed]
            return len(self._pairs)

    def close(self) -> None:
        """Stop listening and cut every connection."""
        _close(self._listener)
        with self._lock:
            self._closed = True
        self._flowing.set()
        self.cut_all()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.socket(self._target[0], socket.SOCK_STREAM)
            try:
                server.connect(self._target[1])
            except OSError:  # the server is down: the client sees a refused connection
                _close(client)
                _close(server)
                continue
            pair = _Pair(client, server, self)
            with self._lock:
                if self._closed:  # accepted just as the proxy closed: cut it too
                    pair.close()
                    return
                self._pairs.append(pair)
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
        self.closed = False

    def upstream(self) -> None:
        try:
            while data := _recv(self.client):
                self.proxy._flowing.wait()
                if self.proxy._should_cut(data):
                    self.cut.set()
                    self.server.sendall(data)
                    # Let the server execute and commit, then lose its answer.
                    threading.Timer(0.3, self.close).start()
                    return
                self.server.sendall(data)
        except OSError:
            pass
        self.close()

    def downstream(self) -> None:
        while (data := _recv(self.server)) and not self.cut.is_set():
            self.proxy._flowing.wait()
            try:
                self.client.sendall(data)
            except OSError:
                break
        if not self.cut.is_set():
            self.close()

    def close(self) -> None:
        self.closed = True
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
