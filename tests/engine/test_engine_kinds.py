"""The engine kinds' specs: what the rest of kvbench asks instead of the kind."""

import pytest

from kvbench.engine.kinds import CacheModel, EngineKind


def test_each_kind_describes_itself():
    described = {
        kind.value: (kind.spec.has_kv_pool, kind.spec.batching, kind.spec.cache_model) for kind in EngineKind
    }
    assert described == {
        "copy": (False, False, CacheModel.PREFIX_CACHE),
        "paged": (True, True, CacheModel.KV_POOL),
    }


def test_specs_are_frozen_hashable_values():
    specs = {EngineKind.COPY.spec: "copy", EngineKind.PAGED.spec: "paged"}
    assert specs[EngineKind.PAGED.spec] == "paged"
    assert hash(EngineKind.COPY.spec) == hash(EngineKind.COPY.spec)
    with pytest.raises(TypeError):
        EngineKind.PAGED.spec.unsupported_breaks["views"] = "changed"  # a read-only mapping
    assert set(EngineKind.PAGED.spec.unsupported_breaks) == {"views", "tiny-hash"}
