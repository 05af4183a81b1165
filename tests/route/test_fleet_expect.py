"""The expectation behind a router: ``kvbench route``'s model of the router's policy, per replica,
requests routed one at a time in the order sent. A replica's expected hits are a single-cache replay
of what it received; one cache over the whole trace expects more than a round-robin fleet can hit."""

import pytest
from conftest import chat_requests

from kvbench.cache.base import CacheConfig
from kvbench.route.expect import fleet_expectation, model_of
from kvbench.run.config import ServerFlags
from kvbench.sim.replay import replay

CACHE = CacheConfig(capacity_blocks=100_000, block_size=16)


def test_round_robin_expects_each_replicas_own_single_cache_replay(chat8):
    # requests sent in trace order, but arriving close together: the model routes them one at a time
    fleet = fleet_expectation(chat8, CACHE, "round_robin", 3)
    assert fleet.replica == [i % 3 for i in range(len(chat8))]
    for replica in range(3):
        mine = [r for r, chosen in zip(chat8, fleet.replica) if chosen == replica]
        alone = replay(mine, CACHE).cached_tokens_per_request.tolist()
        assert [t for t, chosen in zip(fleet.cached_tokens, fleet.replica) if chosen == replica] == alone
    one_cache = replay(chat8, CACHE).cached_tokens_per_request.tolist()
    assert sum(fleet.cached_tokens) < sum(one_cache)  # later turns land where the earlier ones are not


def test_consistent_hash_keeps_every_session_on_one_replica(chat8):
    fleet = fleet_expectation(chat8, CACHE, "consistent_hash", 3)
    on = {}
    for request, replica in zip(chat8, fleet.replica):
        on.setdefault(request.session_id, set()).add(replica)
    assert all(len(replicas) == 1 for replicas in on.values())
    assert fleet.model == "consistent_hash"  # vllm-router's own ring (kvbench.route.furc)


def test_one_replica_is_one_cache(chat8):
    fleet = fleet_expectation(chat8, CACHE, "cache_aware", 1)
    assert fleet.cached_tokens == replay(chat8, CACHE).cached_tokens_per_request.tolist()


def test_kv_aware_one_request_at_a_time_follows_the_shared_system_prompt(chat8):
    """vllm-router's kv_aware, requests one at a time: the first goes to the least loaded replica (the
    first of equal loads), every later one holds the shared system prompt there: one cache's hits."""
    fleet = fleet_expectation(chat8, CACHE, "kv_aware", 3)
    assert fleet.model == "kv_aware" and fleet.replica == [0] * len(chat8)
    assert fleet.cached_tokens == replay(chat8, CACHE).cached_tokens_per_request.tolist()
    tenants = chat_requests(
        num_tenants=8
    )  # salts are no part of a content key (salted lookups: not modelled)
    assert set(fleet_expectation(tenants, CACHE, "kv_aware", 3).replica) == {0}


def test_a_random_policy_has_no_model_and_an_unknown_name_is_refused():
    assert fleet_expectation(chat_requests(num_conversations=2), CACHE, "random", 2) is None
    assert model_of("power_of_two") is None and model_of("round-robin").value == "round-robin"
    with pytest.raises(ValueError, match=r"--fleet-policy 'roundrobin': not a router policy \(choose from"):
        model_of("roundrobin")


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"fleet_policy": "round_robin"}, "--fleet-policy needs --fleet-replicas N or one --replica-metrics"),
        ({"fleet_replicas": 2}, "--fleet-replicas applies with --fleet-policy"),
        ({"fleet_policy": "sticky", "fleet_replicas": 2}, "--fleet-policy 'sticky': not a router policy"),
        ({"fleet_policy": "round_robin", "fleet_replicas": 0}, "--fleet-replicas: 0 must be positive"),
        (
            {"route": "kv_aware", "base_urls": ["http://a/v1", "http://b/v1"]},
            "--route kv_aware reads each replica's cache, which a client-side router cannot see",
        ),
    ],
)
def test_fleet_flags_are_checked_where_they_are_built(flags, message):
    with pytest.raises(ValueError, match=message):
        ServerFlags(**flags)
