"""tests/conftest.py's xdist scopes: a module on one worker,
every namespace test in one scope, shards apart."""

from xdist_scopes import NAMESPACES, SHARDED, scope_of


def test_a_module_is_one_scope():
    assert (
        scope_of("tests/test_errors.py::test_a")
        == scope_of("tests/test_errors.py::test_b[x]")
        == "tests/test_errors.py"
    )


def test_every_module_that_builds_namespaces_shares_one_scope():
    for module in (
        "tests/integrations/trainer/test_faults_two_nodes.py",
        "tests/integrations/trainer/test_faults_trainer_gather.py",
        "tests/integrations/elastic/test_live_cut_off.py",
        "tests/benchmarks/test_wan_smoke.py",
    ):
        assert scope_of(f"{module}::test_x") == NAMESPACES, module


def test_the_documented_commands_run_in_a_scope_per_shard():
    scopes = {scope_of(f"{SHARDED}[{shard}]") for shard in ("readme", "benchmarks", "campaigns")}
    assert len(scopes) == 3 and NAMESPACES not in scopes
    assert scope_of(f"{SHARDED}[{NAMESPACES}]") == NAMESPACES
