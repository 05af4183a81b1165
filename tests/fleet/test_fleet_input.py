"""Bad input to ``kvbench fleet`` and to ``--fleet-policy``: one line naming the flag and the choices,
exit 2, nothing started."""

from kvbench.fleet.routers import ROUTERS, RouterKind


def test_a_policy_the_router_lacks_is_refused_with_its_choices(kvbench, tmp_path):
    scenario = tmp_path / "s.toml"
    scenario.write_text('[workload]\nkind = "shared_prefix"\n')
    code, _, stderr = kvbench("fleet", scenario, "--router", "sglang", "--policy", "consistent_hash")
    assert code == 2
    choices = ", ".join(ROUTERS[RouterKind.SGLANG].policies)
    assert f"--policy: 'consistent_hash' is not one of {choices}" in stderr.replace("\n", " ")
    assert not (tmp_path / "results").exists()


def test_fleet_policy_without_replicas_is_one_line(kvbench, tmp_path, refused_url):
    scenario = tmp_path / "s.toml"
    scenario.write_text('[workload]\nkind = "shared_prefix"\n')
    code, _, stderr = kvbench(
        "run", scenario, "--backend", "openai", "--base-url", refused_url, "--fleet-policy", "round_robin"
    )
    assert code == 2
    assert "--fleet-policy needs --fleet-replicas N or one --replica-metrics URL per replica" in stderr
    assert "Traceback" not in stderr
