"""Options several `specrouter` commands share (cli.py, cli_compare.py)."""

from __future__ import annotations

from pathlib import Path

import click

from specrouter.backends.kv_runtime import RUNTIMES

cache_option = click.option(
    "--cache-dir",
    type=click.Path(path_type=Path),
    default=None,
    help="Folder of pulled models (default: $SPECROUTER_CACHE or the user cache dir).",
)

gpu_layers_option = click.option(
    "--gpu-layers", multiple=True,
    help="Layers of llama.cpp models offloaded to a GPU: N for every model, MODEL=N for one (repeatable; -1: all; "
         "needs a GPU build of llama-cpp-python, `make setup GPU=cuda`).",
)

profile_option = click.option(
    "--profile", "profile_file",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Router costs from this JSON profile (`specrouter profile --json`, or the GPU check's) for the "
         "models it names; the others are profiled here.",
)
router_config_option = click.option(
    "--router-config", "router_config_file",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Tune the router with this TOML file of RouterConfig keys (docs/router.md lists them with their "
         "defaults); keys left out keep their defaults.",
)


def torch_options(command):
    """--device and --torch-runtime: where torch models run and how their KV is held (default None:
    the command's or the config file's default)."""
    command = click.option(
        "--torch-runtime", type=click.Choice(list(RUNTIMES)), default=None,
        help="How torch models hold their KV and run: static (preallocated per sequence, bucketed forwards, CUDA "
             "graphs on a GPU; the default on cuda) or eager (transformers' growing cache; the default on a CPU).",
    )(command)
    return click.option("--device", default=None, help="Where torch models run: cpu (default), cuda, cuda:N.")(command)
