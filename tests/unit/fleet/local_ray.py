"""A Ray connection for the fleet tests: the checkout on the replicas' path (they import the
tests' synthetic build), and Serve's HTTP proxy on a free loopback port.

Without an address it starts a new local instance (address="local"): a bare ray.init()
joins the latest cluster started on this machine, which, under pytest-xdist, was the other
worker's two-node Cluster (its serve.shutdown then killed this worker's Serve controller).
The modules that start Ray are marked `ray`: `make test` runs them apart, one at a time."""

from pathlib import Path

import ray
from ray import serve

from benchmarks.servers import free_port
from specrouter.fleet.deploy import serve_env

ROOT = Path(__file__).resolve().parents[3]



def connect(address: str = "local", **init) -> str:
    """ray.init(address, **init) with the checkout on the workers' path and Serve's settings
    as `serve --ray` sets them (deploy.SERVE_ENV), then Serve on a free port; returns the base URL."""
    ray.init(address=address, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(ROOT), **serve_env()}}, **init)
    port = free_port()
    serve.start(proxy_location="HeadOnly", http_options={"host": "127.0.0.1", "port": port})
    return f"http://127.0.0.1:{port}"
