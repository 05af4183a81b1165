"""vllm-router 0.1.17's ``kv_aware`` against ``kvbench route``'s model of it, pick by pick.

Three ``kvbench serve`` replicas publish their KV events to the real router. Some prompts are sent
to one replica directly (so two replicas can hold the same prefix, which the router's own routing
never makes at concurrency 1), others through the router. The model is a :class:`KvAware` over three
hash caches of the replicas' size, in the router's worker order (``GET /list_workers``), fed the same
requests: direct ones step the named replica's cache, routed ones go where the model picks. Every
routed request must land on the replica the model picked and report the cached tokens the model's
replica gives it: the longest held prefix, ties and misses, and a prefix evicted on one replica.
"""

import contextlib
import importlib.util
import json
import time
import urllib.request
from urllib.parse import urlsplit

import pytest

from kvbench.cache.base import CacheConfig, make_cache
from kvbench.cache.block_hash import BlockHasher
from kvbench.constants import REPLICA_HEADER
from kvbench.fleet.routers import RouterKind, RouterProcess, kv_event_source_args
from kvbench.peer.kvbench_server import KvbenchServer, KvbenchServerConfig
from kvbench.route.kv_aware import KvAware
from kvbench.route.policies import RequestView
from kvbench.sim.step import step

pytestmark = pytest.mark.slow  # three replicas, a router and ~40 requests: ~1-2 min on 2 loaded cores
BLOCK, CAPACITY_BLOCKS = 16, 256
EVENTS_S = 0.5  # time for the replicas' events to reach the router's index before the next request


def words(tag: str, count: int) -> str:
    return " ".join(f"{tag}{i}" for i in range(count))


def post(url: str, body: dict) -> tuple[dict, str]:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read()), response.headers.get(REPLICA_HEADER)


class Fleet:
    """The real replicas and router, and the model over caches in the router's worker order."""

    def __init__(self, urls: list[str], router_url: str, order: list[str]) -> None:
        self.urls, self.router_url = urls, router_url
        self.order = [urls.index(url) for url in order]  # model replica k = router's k-th worker
        self.caches = [make_cache(CacheConfig(CAPACITY_BLOCKS, BLOCK)) for _ in urls]
        self.model = KvAware(len(urls), BLOCK)
        self.model.attach([self.caches[replica] for replica in self.order])
        self.hasher = BlockHasher(BLOCK)
        self.log: list[tuple[str, int, int, int, int]] = []  # label, real, model, reported, expected

    def body(self, system: str, user: str) -> dict:
        messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        return {"model": "kvbench-default", "messages": messages, "max_tokens": 2, "temperature": 0}

    def prompt(self, body: dict):
        rendered, _ = post(self.urls[0] + "/v1/chat/completions/render", body)
        return self.hasher.prompt_blocks(rendered["token_ids"])

    def direct(self, replica: int, system: str, user: str) -> None:
        body = self.body(system, user)
        post(self.urls[replica] + "/v1/chat/completions", body)
        step(self.caches[replica], self.prompt(body))

    def scores(self, system: str, user: str) -> list[int]:
        """The model's score of each replica (in ``urls`` order) for this prompt now."""
        by_order = self.model.scores(RequestView("", self.prompt(self.body(system, user)), 0.0))
        return [by_order[self.order.index(replica)] for replica in range(len(self.urls))]

    def routed(self, label: str, system: str, user: str) -> None:
        time.sleep(EVENTS_S)
        body = self.body(system, user)
        prompt = self.prompt(body)
        picked = self.order[self.model.choose(RequestView(label, prompt, 0.0), [0] * len(self.urls))]
        expected = step(self.caches[picked], prompt).num_hit_blocks * BLOCK
        answer, replica = post(self.router_url + "/v1/chat/completions", body)
        real = [urlsplit(url).netloc for url in self.urls].index(replica)
        reported = answer["usage"]["prompt_tokens_details"]["cached_tokens"]
        self.log.append((label, real, picked, reported, expected))


@contextlib.contextmanager
def fleet(tmp_path):
    if importlib.util.find_spec("vllm_router") is None:
        pytest.skip("vllm_router is not installed (pip install -e '.[fleet]')")
    extra = ("--kv-events", "tcp://127.0.0.1:0", "--cache-size", str(CAPACITY_BLOCKS))
    with contextlib.ExitStack() as stack:
        replicas = [
            stack.enter_context(
                KvbenchServer(
                    KvbenchServerConfig(
                        None, tmp_path / f"replica-{i}.log", "paged", block_size=BLOCK, extra_args=extra
                    )
                )
            )
            for i in range(3)
        ]
        for replica in replicas:
            replica.wait_healthy()
        urls = [replica.url for replica in replicas]
        kv_args = kv_event_source_args(urls, BLOCK)
        router = stack.enter_context(
            RouterProcess(RouterKind.VLLM, "kv_aware", urls, tmp_path / "router.log", extra_args=kv_args)
        )
        router.wait_healthy()
        with urllib.request.urlopen(router.url + "/list_workers", timeout=10) as response:
            order = json.loads(response.read())["urls"]
        yield Fleet(urls, router.url, order)


def test_kv_aware_picks_what_the_model_picks_ties_misses_and_evictions_included(tmp_path):
    with fleet(tmp_path) as f:
        a, b, c = words("alpha", 120), words("beta", 120), words("delta", 120)
        f.direct(0, a, words("x", 60))
        f.direct(1, b, words("y", 60))
        f.direct(2, a, "z")
        f.routed("longest", a, words("x", 60) + " more")  # replica 0 holds more of it than replica 2
        f.routed("tie 0 2", a, words("n", 40))
        f.routed("only 1", b, words("m", 40))
        f.routed("miss", words("gamma", 120), "q")
        f.direct(0, c, "d")
        f.direct(1, c, "e")
        f.routed("tie 0 1", c, words("k", 40))
        f.direct(2, c, "f")
        f.routed("tie 0 1 2", c, words("j", 40))
        before = f.scores(a, words("x", 60) + " again")
        for k in range(CAPACITY_BLOCKS // 20 + 4):  # ~20 blocks each: replica 0 evicts what it held
            f.direct(0, words(f"evict{k}e", 150), "x")
        after = f.scores(a, words("x", 60) + " again")
        f.routed("a evicted on 0", a, words("x", 60) + " again")
    picks = [(label, real, model) for label, real, model, _, _ in f.log]
    assert all(real == model for _, real, model in picks), picks
    assert [(label, reported) for label, _, _, reported, _ in f.log] == [
        (label, expected) for label, _, _, _, expected in f.log
    ]
    by_label = {label: (real, reported) for label, real, _, reported, _ in f.log}
    assert by_label["longest"][0] == 0 and by_label["only 1"][0] == 1
    assert before[0] > before[2] > 0 and after[0] == 0 and after[2] == before[2]  # whatever the order
    assert by_label["a evicted on 0"] == (2, before[2] * BLOCK)  # its system prompt, still on replica 2
