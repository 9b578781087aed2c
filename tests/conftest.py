"""Every test session gets its own specrouter cache: router profiles and acceptance estimates
written by any test (or by a `specrouter` command a test runs: the variable is inherited) land
in a temporary folder, never in the user's cache. The pulled models are read where they are,
through a link, so the real-model tests need no second copy."""

import os

import pytest

from specrouter.models import default_cache_dir


@pytest.fixture(scope="session", autouse=True)
def private_cache(tmp_path_factory):
    models = default_cache_dir()
    link = tmp_path_factory.mktemp("specrouter-cache") / "models"
    if models.is_dir():
        link.symlink_to(models, target_is_directory=True)
    else:
        link.mkdir()
    before = os.environ.get("SPECROUTER_CACHE")
    os.environ["SPECROUTER_CACHE"] = str(link)
    yield link
    if before is None:
        os.environ.pop("SPECROUTER_CACHE", None)
    else:
        os.environ["SPECROUTER_CACHE"] = before
