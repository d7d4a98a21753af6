"""A socket guard: inside ``guarded()`` nothing can reach a non-loopback address.

``socket.socket.connect``, ``socket.socket.connect_ex``, ``socket.socket.sendto`` and
``socket.create_connection`` refuse any address that is not loopback (``127.0.0.0/8``, ``::1``,
``::ffff:127.x.x.x`` or the name ``localhost``) by raising ``SocketGuardError``, which names the refused
address. The check runs *before* the real call, so no packet (not even a DNS query: ``socket.getaddrinfo``
refuses names other than ``localhost`` unless ``block_dns=False``) ever leaves the machine. Unix-domain and
other non-IP sockets are allowed. ``allowed_ports`` narrows loopback further to the given ports (e.g. only the
fakes').

Every attempt is recorded on the yielded ``SocketGuard`` (``attempts``, ``refused``), so a test can assert
that a code path opened no connection at all. The error deliberately is not an ``OSError``: code that treats
network failures as retryable must not mistake a test-isolation breach for a flaky network.

    with guarded() as guard:
        ...
    assert guard.refused == []

The ``socket_guard`` pytest fixture wraps one test in ``guarded()`` and yields the guard.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest

__all__ = ["SocketGuard", "SocketGuardError", "guarded", "socket_guard"]


class SocketGuardError(RuntimeError):
    """A test tried to reach an address outside loopback."""


@dataclass
class SocketGuard:
    """Records every connection attempt made while the guard is active."""

    allowed_ports: frozenset[int] | None = None
    attempts: list[tuple[str, str]] = field(default_factory=list)  # (operation, "host:port")
    refused: list[tuple[str, str]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def check(self, operation: str, host: Any, port: Any) -> None:
        """Raise ``SocketGuardError`` unless ``host:port`` is loopback (and an allowed port)."""
        where = f"{host}:{port}"
        allowed = _is_loopback(host) and (self.allowed_ports is None or port in self.allowed_ports)
        with self._lock:
            self.attempts.append((operation, where))
            if not allowed:
                self.refused.append((operation, where))
        if not allowed:
            scope = (
                "loopback" if self.allowed_ports is None else f"loopback ports {sorted(self.allowed_ports)}"
            )
            raise SocketGuardError(
                f"socket guard refused {operation} to {where}: tests may only reach {scope}"
            )

    def check_name(self, host: Any) -> None:
        """Refuse resolving names that would need DNS."""
        if host is None or _is_loopback(host) or _is_ip_literal(host):
            return
        with self._lock:
            self.refused.append(("getaddrinfo", str(host)))
        raise SocketGuardError(f"socket guard refused resolving {host!r}: tests may only reach loopback")


def _host_text(host: Any) -> str:
    if isinstance(host, bytes):
        host = host.decode("ascii", "replace")
    return str(host).split("%", 1)[0].strip("[]")  # drop IPv6 zone ids and URL brackets


def _is_ip_literal(host: Any) -> bool:
    try:
        ipaddress.ip_address(_host_text(host))
    except ValueError:
        return False
    return True


def _is_loopback(host: Any) -> bool:
    text = _host_text(host)
    if text.lower() == "localhost":
        return True
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


def _ip_target(sock: socket.socket, address: Any) -> tuple[Any, Any] | None:
    """(host, port) for IP sockets; None for Unix and other families, which the guard leaves alone."""
    if sock.family not in (socket.AF_INET, socket.AF_INET6):
        return None
    if isinstance(address, tuple) and len(address) >= 2:
        return address[0], address[1]
    return address, None


_install_lock = threading.Lock()


@contextmanager
def guarded(allowed_ports: Collection[int] | None = None, block_dns: bool = True) -> Iterator[SocketGuard]:
    """Refuse non-loopback connections (and DNS lookups) until the block exits; nests and restores cleanly."""
    guard = SocketGuard(frozenset(allowed_ports) if allowed_ports is not None else None)
    with _install_lock:
        saved = (
            socket.socket.connect,
            socket.socket.connect_ex,
            socket.socket.sendto,
            socket.create_connection,
            socket.getaddrinfo,
        )
        real_connect, real_connect_ex, real_sendto, real_create_connection, real_getaddrinfo = saved

        def connect(self: socket.socket, address: Any) -> None:
            target = _ip_target(self, address)
            if target is not None:
                guard.check("connect", *target)
            return real_connect(self, address)

        def connect_ex(self: socket.socket, address: Any) -> int:
            target = _ip_target(self, address)
            if target is not None:
                guard.check("connect_ex", *target)
            return real_connect_ex(self, address)

        def sendto(self: socket.socket, data: Any, *args: Any) -> int:
            address = args[-1]  # sendto(data, address) or sendto(data, flags, address)
            target = _ip_target(self, address)
            if target is not None:
                guard.check("sendto", *target)
            return real_sendto(self, data, *args)

        def create_connection(address: tuple[Any, Any], *args: Any, **kwargs: Any) -> socket.socket:
            guard.check("create_connection", address[0], address[1])
            return real_create_connection(address, *args, **kwargs)

        def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
            guard.check_name(host)
            return real_getaddrinfo(host, *args, **kwargs)

        patches: dict[str, Callable[..., Any]] = {
            "connect": connect,
            "connect_ex": connect_ex,
            "sendto": sendto,
        }
        for name, function in patches.items():
            setattr(socket.socket, name, function)
        socket.create_connection = create_connection  # type: ignore[assignment]
        if block_dns:
            socket.getaddrinfo = getaddrinfo  # type: ignore[assignment]
    try:
        yield guard
    finally:
        with _install_lock:
            socket.socket.connect = real_connect  # type: ignore[method-assign]
            socket.socket.connect_ex = real_connect_ex  # type: ignore[method-assign]
            socket.socket.sendto = real_sendto  # type: ignore[method-assign]
            socket.create_connection = real_create_connection  # type: ignore[assignment]
            socket.getaddrinfo = real_getaddrinfo  # type: ignore[assignment]


@pytest.fixture
def socket_guard() -> Iterator[SocketGuard]:
    """Run the test with non-loopback connections refused; yields the ``SocketGuard`` with its recorded
    attempts."""
    with guarded() as guard:
        yield guard
