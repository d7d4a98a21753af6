"""``local_server._port_free``: a port whose last server was stopped a moment ago (its connections in
TIME_WAIT) is free for the next server, as uvicorn binds it; a port something listens on is not."""

from __future__ import annotations

import socket

from skillopt.shell import local_server


def _port_in_time_wait() -> int:
    """A loopback port with no listener and a connection of its closed listener in TIME_WAIT (the side that
    closes first keeps TIME_WAIT: here the accepted, server side, as when a server stops). The listener sets
    SO_REUSEADDR, as uvicorn's does; its connections inherit it."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    accepted, _ = listener.accept()
    accepted.close()  # the server side closes first ...
    client.recv(1)  # ... the client reads the end of the stream and closes too
    client.close()
    listener.close()
    return port


def test_a_port_with_only_time_wait_connections_is_free():
    port = _port_in_time_wait()
    with socket.socket() as plain:  # without SO_REUSEADDR the bind fails: the fault the probe had
        try:
            plain.bind(("127.0.0.1", port))
            lingering = False
        except OSError:
            lingering = True
    assert lingering, "no TIME_WAIT connection on the port: the test does not reproduce the restart"
    assert local_server._port_free(port)


def test_a_port_something_listens_on_is_not_free():
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        assert not local_server._port_free(listener.getsockname()[1])
