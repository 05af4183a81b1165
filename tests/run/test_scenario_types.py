"""Malformed scenario values are one line with file:line and the field, in
kvbench's words, never Python's ("'>' not supported between instances of 'str' and 'int'")."""

import pytest

from kvbench.errors import InputError
from kvbench.run.scenario import find_scenario, load_scenario, shipped_scenarios
from kvbench.run.source import load_source

HEAD = '[workload]\nkind = "shared-prefix"\nnum_requests = 3\nsystem_tokens = 64\nquestion_tokens = 16\n'


@pytest.mark.parametrize(
    "tail,where,needle",
    [
        ('[cache]\nttl_s = "abc"\n', ":7: field 'cache.ttl_s'", "expected a valid number, got 'abc'"),
        ('[cache]\nkind = "tree"\n', ":7: field 'cache.kind'", "'hash' or 'radix'"),
        ('[sim]\nsizes = [64, "x"]\n', ":7: field 'sim.sizes[1]'", "expected a valid integer"),
        ('[run]\ntemperature = "hot"\n', ":7: field 'run.temperature'", "expected a valid number, got 'hot'"),
        ("[run]\nwarmup = 1.5\n", ":7: field 'run.warmup'", "integer"),
        ('[run]\nignore_eos = "yes"\n', ":7: field 'run.ignore_eos'", "valid boolean"),
        ('max_tokens = "4"\n', ":6: field 'workload.max_tokens'", "valid integer"),
    ],
)
def test_a_wrong_type_names_the_file_line_and_field(tmp_path, tail, where, needle):
    path = tmp_path / "bad.toml"
    path.write_text(HEAD + tail)
    with pytest.raises(InputError) as error:
        load_source(path, None) if "[run]" in tail else load_scenario(path)
    message = str(error.value)
    assert f"{path}{where}" in message and needle in message and "\n" not in message
    assert "not supported between" not in message and "TypeError" not in message


def test_every_shipped_scenario_still_loads():
    for name in shipped_scenarios():
        assert load_scenario(find_scenario(name)).workload_kind
