"""A router that lists its model as ``unknown`` (sglang-router over workers whose model it could not
read): the run takes the model the replicas list (``--replica-metrics``), or stops naming ``--model``,
instead of sending every request for a model called ``unknown``."""

import pytest

from kvbench.backends.openai.admin import list_models
from kvbench.errors import InputError
from kvbench.run.config import BackendKind, RunConfig, ServerFlags
from kvbench.run.openai_plan import served_model


def config(url: str, *replicas: str) -> RunConfig:
    return RunConfig("x.toml", BackendKind.OPENAI, server=ServerFlags(base_url=url, replica_metrics=replicas))


def test_the_replicas_model_survives_a_router_listing_unknown(fake_server, server):
    router = fake_server("unknown_model")
    served, _ = list_models(server.url, "")
    assert served and served[0] != "unknown"
    assert served_model(config(router.url, server.url.removesuffix("/v1")), "") == served[0]


def test_without_replicas_the_run_stops_naming_model(fake_server):
    router = fake_server("unknown_model")
    with pytest.raises(InputError, match=r"lists its model as 'unknown' .*give --model NAME"):
        served_model(config(router.url), "")
