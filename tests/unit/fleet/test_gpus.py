"""What an engine replica asks Ray for (deploy.replica_actor_options): a GPU when its pool
runs on one, [ray] gpus_per_replica otherwise; and the starts Ray could never place."""

import pytest

from specrouter.errors import InvalidParameterError
from specrouter.fleet.deploy import FleetStartError, check_local_gpus, engine_deployment
from specrouter.server.config import RayConfig, ServeConfig, load_config


def actor_options(**config) -> dict:
    return engine_deployment(ServeConfig(**config)).ray_actor_options


def test_a_cpu_pool_asks_for_cpus_only():
    assert actor_options() == {"num_cpus": 1}
    assert actor_options(threads=4) == {"num_cpus": 4}
    assert actor_options(gpu_layers=["0"]) == {"num_cpus": 1}


def test_a_pool_on_a_gpu_asks_for_one_gpu_per_replica():
    assert actor_options(device="cuda") == {"num_cpus": 1, "num_gpus": 1}
    assert actor_options(device="cuda:0", threads=2) == {"num_cpus": 2, "num_gpus": 1}
    assert actor_options(gpu_layers=["-1"]) == {"num_cpus": 1, "num_gpus": 1}
    assert actor_options(gpu_layers=["qwen2.5-coder-0.5b=12"]) == {"num_cpus": 1, "num_gpus": 1}


def test_gpus_per_replica_replaces_the_default():
    assert actor_options(device="cuda", ray=RayConfig(gpus_per_replica=0.5)) == {"num_cpus": 1, "num_gpus": 0.5}
    assert actor_options(device="cuda", ray=RayConfig(gpus_per_replica=2)) == {"num_cpus": 1, "num_gpus": 2}
    assert actor_options(device="cuda", ray=RayConfig(gpus_per_replica=0)) == {"num_cpus": 1}
    assert actor_options(ray=RayConfig(gpus_per_replica=1)) == {"num_cpus": 1, "num_gpus": 1}


def test_the_rest_of_the_deployment_is_unchanged_by_gpus():
    deployment = engine_deployment(ServeConfig(device="cuda", max_batch=4, max_queue=32, ray=RayConfig(replicas=3)))
    assert (deployment.name, deployment.num_replicas, deployment.max_ongoing_requests) == ("EngineReplica", 3, 37)


def test_the_config_files_ray_table_sets_gpus_per_replica(tmp_path):
    file = tmp_path / "serve.toml"
    file.write_text('device = "cuda"\n[ray]\nenabled = true\nreplicas = 2\ngpus_per_replica = 0.5\n')
    config = load_config(file)
    assert (config.ray.gpus_per_replica, config.replica_gpus) == (0.5, 0.5)
    file.write_text("[ray]\ngpus_per_replica = 1.5\n")
    with pytest.raises(InvalidParameterError) as exc:
        load_config(file)
    assert str(exc.value) == ("invalid server configuration: ray: Value error, gpus_per_replica above 1 must be a "
                              "whole number (Ray's rule), got 1.5")


def test_a_device_index_a_replica_cannot_see_is_refused():
    with pytest.raises(InvalidParameterError) as exc:
        load_config(None, device="cuda:1", ray={"enabled": True})
    assert str(exc.value) == ("invalid server configuration: config: Value error, device cuda:1: a Ray replica sees "
                              "only the 1 GPU(s) Ray assigns it (gpus_per_replica 1), as cuda:0 up; use device cuda")
    assert load_config(None, device="cuda:1", ray={"enabled": True, "gpus_per_replica": 2}).device == "cuda:1"
    assert load_config(None, device="cuda:1").device == "cuda:1"  # one process sees every GPU


@pytest.mark.parametrize("config, available", [
    (ServeConfig(), 0),
    (ServeConfig(device="cuda", ray=RayConfig(replicas=2)), 2),
    (ServeConfig(device="cuda", ray=RayConfig(replicas=2, gpus_per_replica=0.5)), 1),
    (ServeConfig(device="cuda", ray=RayConfig(min_replicas=2, max_replicas=8)), 2),
    (ServeConfig(device="cuda", ray=RayConfig(replicas=4, gpus_per_replica=0)), 0),
])
def test_replicas_that_fit_the_local_gpus_start(config, available):
    check_local_gpus(config, available)


@pytest.mark.parametrize("config, available, needed, gpus, room", [
    (ServeConfig(device="cuda", ray=RayConfig(replicas=2)), 1, 2, "1", 1),
    (ServeConfig(gpu_layers=["-1"]), 0, 1, "1", 0),
    (ServeConfig(device="cuda", ray=RayConfig(replicas=3, gpus_per_replica=0.5)), 1, 3, "0.5", 2),
    (ServeConfig(device="cuda", ray=RayConfig(replicas=3, gpus_per_replica=0.6)), 2, 3, "0.6", 2),  # 1.8 <= 2: no
    (ServeConfig(device="cuda", ray=RayConfig(min_replicas=3, max_replicas=4)), 2, 3, "1", 2),
])
def test_replicas_ray_would_leave_pending_are_an_error(config, available, needed, gpus, room):
    with pytest.raises(FleetStartError) as exc:
        check_local_gpus(config, available)
    assert str(exc.value) == (f"{needed} replicas of {gpus} GPU each need more GPUs than this machine's Ray instance "
                              f"has (GPUs: {available}, room for {room} replicas): Ray would leave the others "
                              "pending; ask for fewer replicas or set [ray] gpus_per_replica")
