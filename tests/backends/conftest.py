"""Fixtures: fake servers (see fake_servers.py) and a port where nothing listens."""

import socket

import pytest
from fake_servers import FakeServer


@pytest.fixture
def fake_server():
    """fake_server(behaviour, script=()) -> FakeServer, stopped after the test."""
    servers = []

    def start(behaviour, script=()):
        servers.append(FakeServer(behaviour, script))
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def refused_url():
    """A loopback URL where nothing listens (a port bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"
