"""Where pgqueue's HTTP listeners bind: one default address, and one error for a port not had.

Three commands listen: `pgqueue web`, `pgqueue exporter` and a worker's
`--metrics-port`. All three bind to DEFAULT_HOST unless told otherwise, and
all three turn a bind that fails into the same CannotListen, before they say
where they serve.
"""

from __future__ import annotations

import socket

from pgqueue._errors import PgQueueError

# Loopback by default: a dashboard or a /metrics endpoint reachable from the
# network must be asked for (0.0.0.0 for a scraper on another host or in a
# container), never left open by an unset flag.
DEFAULT_HOST = "127.0.0.1"


class CannotListen(PgQueueError, OSError):
    """A listener could not bind its address (the port is taken, the address is not this host's)."""

    def __init__(self, host: str, port: int, exc: OSError) -> None:
        """The error for binding host:port failing with exc."""
        reason = exc.strerror or str(exc)
        super().__init__(
            f"cannot listen on {address(host, port)}: {reason}; choose another port or address",
            what=f"cannot listen on {address(host, port)}: {reason}",
        )
        self.host = host
        self.port = port
        self.errno = exc.errno
        self.strerror = reason

    def __str__(self) -> str:
        # OSError's own would print "[Errno 98] Address already in use" alone
        return str(self.args[0])


def address(host: str, port: int) -> str:
    """host:port as a URL writes it ([::1]:8765 for an IPv6 address)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def bind(host: str, port: int) -> socket.socket:
    """A TCP socket listening on host:port (port 0: any free one); else CannotListen."""
    # As uvicorn binds: the family by the address's form, SO_REUSEADDR so a
    # restart is not refused while the last run's connections linger.
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise CannotListen(host, port, exc) from exc
    except BaseException:
        sock.close()
        raise
    return sock
