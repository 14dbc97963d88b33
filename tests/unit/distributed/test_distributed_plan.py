"""The Ray resource plan and the ``cluster:`` config: what a run asks for, and the errors for what no cluster
can grant or no layout can run, all before anything starts (no Ray needed)."""

from __future__ import annotations

import pytest

from tests.helpers import EXAMPLE, write_config
from trine.config import ClusterConfig, ConfigError, RunConfig, load_config
from trine.distributed.plan import ResourcePlan


def _plan(explorers: int = 2, sqlite: bool = True, **cluster) -> ResourcePlan:
    return ResourcePlan.of(ClusterConfig(backend="ray", **cluster), explorers, sqlite)


def test_bundles_put_the_trainer_and_the_writer_together_and_one_explorer_each():
    plan = _plan(3, trainer_cpus=1, trainer_gpus=1, explorer_cpus=0.5, explorer_gpus=0.5)
    assert plan.bundles() == [{"CPU": 1.1, "GPU": 1.0}] + [{"CPU": 0.5, "GPU": 0.5}] * 3
    assert plan.totals() == pytest.approx({"CPU": 2.6, "GPU": 2.5})
    assert plan.strategy == "PACK" and plan.writer


def test_with_postgresql_there_is_no_writer_actor():
    plan = _plan(1, sqlite=False, placement="spread")
    assert [r.name for r in plan.roles] == ["trainer", "explorer"]
    assert plan.bundles() == [{"CPU": 0.5}, {"CPU": 0.5}] and plan.strategy == "SPREAD"


def test_a_plan_that_fits_has_no_problems():
    assert _plan(2).problems({"CPU": 2.0}, [{"CPU": 2.0}]) == []


def test_every_problem_names_the_numbers_and_the_setting_to_change():
    plan = _plan(4, explorer_cpus=1, trainer_gpus=1, explorer_gpus=2, placement="strict_spread")
    problems = plan.problems({"CPU": 4.0, "GPU": 1.0}, [{"CPU": 2.0, "GPU": 1.0}, {"CPU": 2.0}])
    text = "\n".join(problems)
    assert "asks for 4.6 CPUs (1 × trainer 0.5, 1 × buffer writer 0.1, 4 × explorer 1)" in text
    assert "has 4" in text and "cluster.trainer_cpus / explorer_cpus" in text
    assert "asks for 9 GPUs" in text and "has 1" in text
    assert "an explorer asks for 2 GPUs in one bundle, but the largest node has 1" in text
    assert "strict_spread" in text and "5 bundles" in text and "has 2" in text
    assert len(problems) == 7  # CPUs, GPUs, each of the 4 explorers, strict_spread


def test_the_printed_plan_lists_actors_resources_and_nodes():
    table = _plan(2).table({0: "10.0.0.1", 1: "10.0.0.2", 2: "10.0.0.2"})
    lines = table.splitlines()
    assert lines[0] == "resource plan (Ray):"
    assert lines[2].split() == ["trainer", "1", "0.5", "0", "10.0.0.1"]
    assert lines[3].split() == ["buffer", "writer", "1", "0.1", "0", "10.0.0.1"]
    assert lines[4].split() == ["explorer", "2", "0.5", "0", "10.0.0.2"]
    assert lines[5].split() == ["total", "1.6", "0", "placement", "PACK"]


def _ray_config(tmp_path, **over) -> RunConfig:
    data = {
        "mode": "async",
        "cluster": {"backend": "ray"},
        "buffer": {"storage": "sql"},
        "tasks": {"total_steps": 1, "train": {"path": str(EXAMPLE / "data" / "train.jsonl")}},
        **over,
    }
    return load_config(write_config(tmp_path / "c.yaml", data))[0]


def test_ray_defaults_to_the_broadcast_weight_sync(tmp_path):
    cfg = _ray_config(tmp_path)
    assert cfg.processes and cfg.sync_method == "broadcast"
    assert _ray_config(tmp_path, sync={"method": "published"}).sync_method == "published"


def test_every_layout_error_of_a_ray_config_at_once(tmp_path):
    with pytest.raises(ConfigError) as err:
        _ray_config(
            tmp_path, mode="sync", launch="thread", buffer={"storage": "memory"}, sync={"method": "copy"}
        )
    text = str(err.value)
    assert "launch: thread with cluster.backend: ray" in text
    assert "cluster.backend: ray runs mode async" in text and "max_staleness: 0" in text
    assert "buffer.storage='memory' cannot be shared between processes" in text
    assert "sync.method 'copy' cannot reach another process" in text


def test_broadcast_outside_processes_is_an_error(tmp_path):
    with pytest.raises(
        ConfigError, match="sync.method 'broadcast' is for launch: processes or cluster.backend"
    ):
        _ray_config(tmp_path, cluster={"backend": "local"}, sync={"method": "broadcast"})


def test_trainer_ranks_are_one_gpu_actors_each_in_its_own_bundle(tmp_path):
    assert ClusterConfig(backend="ray", trainer_gpus=1).trainer_gpus == 1
    with pytest.raises(ValueError, match=r"trainer_gpus: 2: .* set trainer_gpus: 1 and trainer_ranks: 2"):
        ClusterConfig(backend="ray", trainer_gpus=2)
    with pytest.raises(ValueError, match=r"trainer_ranks: 2 starts trainer actors on Ray .*torchrun"):
        ClusterConfig(trainer_ranks=2)
    plan = ResourcePlan.of(
        ClusterConfig(backend="ray", trainer_ranks=3, trainer_gpus=1, explorer_gpus=1), 2, True
    )
    assert (
        plan.bundles()
        == [{"CPU": 0.6, "GPU": 1.0}, {"CPU": 0.5, "GPU": 1.0}, {"CPU": 0.5, "GPU": 1.0}]
        + [{"CPU": 0.5, "GPU": 1.0}] * 2
    )  # rank 0 with the writer, ranks 1-2, explorers 0-1
    assert plan.totals()["GPU"] == 5
    too_big = plan.problems({"CPU": 8.0, "GPU": 8.0}, [{"CPU": 8.0, "GPU": 0.5}] * 8)
    assert any(p.startswith("a trainer rank asks for 1 GPUs in one bundle") for p in too_big), too_big
    with pytest.raises(
        ConfigError, match=r"cluster.trainer_ranks: 2 splits every step .* set trainer.fsdp: true"
    ):
        _ray_config(tmp_path, cluster={"backend": "ray", "trainer_ranks": 2})
