"""Fixtures: fake servers (see fake_servers.py) and a scenario file of three requests."""

import pytest
from cli_and_rows import file_fixture
from fake_servers import FakeServer
from tiny_workloads import tiny_shared_prefix

# tiny.toml: 3 shared-prefix requests (64-token system prompt, 3 output tokens)
tiny_scenario = file_fixture(tiny_shared_prefix(3), "tiny.toml")


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
