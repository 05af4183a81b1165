import pytest

from kvbench.workloads.conversations import ChatConfig
from kvbench.workloads.kinds import workload_requests


def chat_requests(**overrides):
    """A small chat trace (cl100k tokens), sorted by arrival as the router sees it."""
    config = ChatConfig(
        **{
            "num_conversations": 8,
            "turns": "uniform:3,5",
            "system_tokens": 200,
            "conversation_rate_per_s": 2.0,
            "think_time_s": 2.0,
            **overrides,
        }
    )
    return sorted(workload_requests("chat", config).requests, key=lambda r: r.arrival_s)


@pytest.fixture(scope="session")
def chat8():
    return chat_requests()


@pytest.fixture(scope="session")
def chat8_tenants():
    return chat_requests(num_tenants=8)  # one salt per conversation: sessions share nothing
