"""`specrouter convert`: make the torch variants of pool models (see specrouter.convert).

Registered on the main command group by specrouter.cli; also runnable on its own as
`python -m specrouter.cli_torch convert NAME...`. Importing this module does not
import torch.
"""

from __future__ import annotations

import sys

import click

from specrouter.cli_options import cache_option
from specrouter.convert import convert as convert_model
from specrouter.convert import converted_dir, is_converted, split_torch_name
from specrouter.errors import SpecRouterError, UnknownModelError
from specrouter.models import DEFAULT_POOL

#: Models converted when no NAME is given: the Qwen pair that shares a tokenizer.
DEFAULT_CONVERT = ("qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b")


@click.command("convert")
@click.argument("names", nargs=-1)
@click.option("--pull", "pull_missing", is_flag=True, help="Pull a model's GGUF first if it is missing.")
@click.option("--force", is_flag=True, help="Convert again even if a converted folder exists.")
@cache_option
def convert(names, pull_missing, force, cache_dir) -> None:
    """Convert pulled GGUF models to torch (safetensors, float32), once.

    NAME is a pool model (qwen2.5-coder-1.5b) or one of its torch names
    (qwen2.5-coder-1.5b:torch-fp32); default: the Qwen 0.5B and 1.5B. The result lives in
    <cache>/torch/NAME/ and serves every dtype: use NAME:torch-fp32, NAME:torch-bf16 or
    NAME:torch-fp16 in --chain. Loading a GGUF dequantizes it: minutes and several GB of
    memory per model; models are converted one at a time.
    """
    for raw in names or DEFAULT_CONVERT:
        parsed = split_torch_name(raw)
        name = parsed[0] if parsed else raw
        if name not in DEFAULT_POOL:
            raise UnknownModelError(f"unknown model {raw!r}: known models are {', '.join(DEFAULT_POOL)}")
        if is_converted(name, cache_dir) and not force:
            click.echo(f"{name}: already converted: {converted_dir(name, cache_dir)}")
            continue
        path = convert_model(name, cache_dir, pull_missing=pull_missing, force=force)
        click.echo(f"{name}: {path}")


@click.group()
def _standalone() -> None:
    """specrouter torch tools."""


_standalone.add_command(convert)


def main() -> None:
    try:
        _standalone(standalone_mode=False)
    except SpecRouterError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)


if __name__ == "__main__":
    main()
