"""Models where Ollama, the Hugging Face hub cache and LM Studio keep them: fake folders of
each tool in tmp_path, with GGUF files of a header only (nothing is loaded here; tests/real
loads a resolved model)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from specrouter import models
from specrouter.cli import main
from specrouter.convert import split_torch_name
from specrouter.errors import ModelFileError, UnknownModelError
from specrouter.model_sources import (HF_FORM, LMSTUDIO_FORM, OLLAMA_FORM, OLLAMA_MODEL_LAYER, hf_hub_cache,
                                      is_source_spec, lmstudio_models_dirs, ollama_models_dir, resolve_source)

GGUF = b"GGUF\x03\x00\x00\x00 header only"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
ENV = ("OLLAMA_MODELS", "HF_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME", "LMSTUDIO_MODELS")


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch) -> Path:
    """A home of its own and none of the tools' variables: the user's folders are never read."""
    for name in ENV:
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return home


def ollama_model(folder: Path, manifest_path: str, data: bytes = GGUF, manifest: str | None = None) -> Path:
    """A blob and the manifest naming it at manifests/<manifest_path>; returns the blob."""
    digest = hashlib.sha256(data).hexdigest()
    blob = folder / "blobs" / f"sha256-{digest}"
    blob.parent.mkdir(parents=True, exist_ok=True)
    blob.write_bytes(data)
    layers = [{"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:" + "1" * 64, "size": 5},
              {"mediaType": OLLAMA_MODEL_LAYER, "digest": f"sha256:{digest}", "size": len(data)}]
    file = folder / "manifests" / manifest_path
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_text(manifest if manifest is not None else json.dumps({"schemaVersion": 2, "layers": layers}))
    return blob


def hf_model(hub: Path, repo: str, file: str, data: bytes = GGUF, ref: str | None = "main",
             commit: str = COMMIT) -> Path:
    """A repository in the hub cache's layout: the blob, the snapshot's link to it and the ref;
    returns the link."""
    folder = hub / f"models--{repo.replace('/', '--')}"
    blob = folder / "blobs" / hashlib.sha256(data).hexdigest()
    blob.parent.mkdir(parents=True, exist_ok=True)
    blob.write_bytes(data)
    link = folder / "snapshots" / commit / file
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(Path(*[".."] * (len(Path(file).parts) + 1), "blobs", blob.name))
    if ref is not None:
        (folder / "refs" / ref).parent.mkdir(parents=True, exist_ok=True)
        (folder / "refs" / ref).write_text(commit)
    return link


def lmstudio_model(folder: Path, path: str, data: bytes = GGUF) -> Path:
    file = folder / path
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_bytes(data)
    return file


# --- Ollama ---

def test_ollama_names_plain_tagged_namespaced_and_hosted(tmp_path, monkeypatch):
    folder = tmp_path / "ollama"
    monkeypatch.setenv("OLLAMA_MODELS", str(folder))
    latest = ollama_model(folder, "registry.ollama.ai/library/qwen2.5-coder/latest", GGUF + b"1")
    tagged = ollama_model(folder, "registry.ollama.ai/library/qwen2.5-coder/0.5b", GGUF + b"2")
    spaced = ollama_model(folder, "registry.ollama.ai/someone/coder/q4_K_M", GGUF + b"3")
    hosted = ollama_model(folder, "hf.co/bartowski/Qwen-GGUF/Q4_K_M", GGUF + b"4")
    assert ollama_models_dir() == folder
    assert models.resolve_model("ollama:qwen2.5-coder") == latest
    assert models.resolve_model("ollama:qwen2.5-coder:latest") == latest
    assert models.resolve_model("ollama:qwen2.5-coder:0.5b") == tagged
    assert models.resolve_model("ollama:someone/coder:q4_K_M") == spaced
    assert models.resolve_model("ollama:hf.co/bartowski/Qwen-GGUF:Q4_K_M") == hosted


def test_ollama_default_folder_is_in_home(home):
    blob = ollama_model(home / ".ollama" / "models", "registry.ollama.ai/library/smollm2/135m")
    assert ollama_models_dir() == home / ".ollama" / "models"
    assert models.resolve_model("ollama:smollm2:135m") == blob


def test_ollama_model_not_pulled_names_the_pull_command(home):
    manifest = home / ".ollama/models/manifests/registry.ollama.ai/library/qwen2.5-coder/latest"
    with pytest.raises(ModelFileError) as err:
        models.resolve_model("ollama:qwen2.5-coder")
    assert str(err.value) == (f"model 'ollama:qwen2.5-coder' is not downloaded: {manifest} does not exist; "
                              "run `ollama pull qwen2.5-coder:latest`")


def test_ollama_blob_missing_names_the_pull_command(home):
    blob = ollama_model(home / ".ollama" / "models", "registry.ollama.ai/someone/coder/7b")
    blob.unlink()
    with pytest.raises(ModelFileError) as err:
        models.resolve_model("ollama:someone/coder:7b")
    assert str(err.value) == (f"model 'ollama:someone/coder:7b' is not downloaded: {blob} does not exist; "
                              "run `ollama pull someone/coder:7b`")


@pytest.mark.parametrize(("manifest", "problem"), [
    ("{not json", "is not valid JSON (Expecting property name enclosed in double quotes: line 1 column 2 (char 1))"),
    ("[]", f"has no layer of media type {OLLAMA_MODEL_LAYER}"),
    ('{"layers": [{"mediaType": "application/vnd.ollama.image.license", "digest": "sha256:00"}]}',
     f"has no layer of media type {OLLAMA_MODEL_LAYER}"),
])
def test_a_bad_ollama_manifest_is_refused(home, manifest, problem):
    folder = home / ".ollama" / "models"
    ollama_model(folder, "registry.ollama.ai/library/m/latest", manifest=manifest)
    with pytest.raises(ModelFileError) as err:
        models.resolve_model("ollama:m")
    assert str(err.value) == (f"model 'ollama:m': the Ollama manifest "
                              f"{folder / 'manifests/registry.ollama.ai/library/m/latest'} {problem}")


@pytest.mark.parametrize("digest", ["sha256:../../etc", "md5:" + "0" * 32, None])
def test_an_ollama_model_layer_without_a_sha256_digest_is_refused(home, digest):
    folder = home / ".ollama" / "models"
    layer = {"mediaType": OLLAMA_MODEL_LAYER, **({"digest": digest} if digest is not None else {})}
    ollama_model(folder, "registry.ollama.ai/library/m/latest", manifest=json.dumps({"layers": [layer]}))
    with pytest.raises(ModelFileError) as err:
        models.resolve_model("ollama:m")
    assert str(err.value) == (f"model 'ollama:m': the model layer of the Ollama manifest "
                              f"{folder / 'manifests/registry.ollama.ai/library/m/latest'} has no "
                              f"sha256:<64 hex digits> digest (got {digest!r})")


def test_a_blob_that_is_not_gguf_is_refused(home):
    blob = ollama_model(home / ".ollama" / "models", "registry.ollama.ai/library/m/latest", b"PK\x03\x04 zip")
    with pytest.raises(ModelFileError) as err:
        models.resolve_model("ollama:m")
    assert str(err.value) == (f"model 'ollama:m': {blob} is not a GGUF file "
                              "(it starts with b'PK\\x03\\x04', not b'GGUF')")


# --- Hugging Face hub cache ---

@pytest.mark.parametrize(("variables", "hub"), [
    ({"HF_HUB_CACHE": "custom/hub", "HF_HOME": "hf-home", "XDG_CACHE_HOME": "xdg"}, "custom/hub"),
    ({"HF_HOME": "hf-home", "XDG_CACHE_HOME": "xdg"}, "hf-home/hub"),
    ({"XDG_CACHE_HOME": "xdg"}, "xdg/huggingface/hub")])
def test_hf_cache_follows_its_variables(tmp_path, monkeypatch, variables, hub):
    for name, value in variables.items():
        monkeypatch.setenv(name, str(tmp_path / value))
    assert hf_hub_cache() == tmp_path / hub
    link = hf_model(tmp_path / hub, "Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
    path = models.resolve_model("hf:Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
    assert path == link and path.is_symlink()  # the snapshot's name: split GGUF parts are found beside it
    assert path.resolve().parent.name == "blobs"


def test_hf_cache_default_folder_is_in_home(home):
    assert hf_hub_cache() == home / ".cache" / "huggingface" / "hub"
    link = hf_model(hf_hub_cache(), "o/r", "Q4_K_M/model-00001-of-00002.gguf")
    assert models.resolve_model("hf:o/r/Q4_K_M/model-00001-of-00002.gguf") == link


def test_hf_revisions_by_ref_and_by_commit(home):
    hub = hf_hub_cache()
    main_file = hf_model(hub, "o/r", "m.gguf", GGUF + b"main")
    other = "f" * 40
    branch_file = hf_model(hub, "o/r", "m.gguf", GGUF + b"branch", ref="q8", commit=other)
    commit_file = hf_model(hub, "o/r", "m.gguf", GGUF + b"old", ref=None, commit="e" * 40)
    assert models.resolve_model("hf:o/r/m.gguf") == main_file
    assert models.resolve_model("hf:o/r/m.gguf@q8") == branch_file
    assert models.resolve_model(f"hf:o/r/m.gguf@{other}") == branch_file
    assert models.resolve_model(f"hf:o/r/m.gguf@{'e' * 40}") == commit_file


def test_hf_model_not_downloaded_names_the_download_command(home):
    hub = hf_hub_cache()
    with pytest.raises(ModelFileError) as err:
        models.resolve_model("hf:o/r/m.gguf")
    assert str(err.value) == (f"model 'hf:o/r/m.gguf' is not downloaded: {hub / 'models--o--r/refs/main'} does not "
                              "exist; run `hf download o/r m.gguf`")
    link = hf_model(hub, "o/r", "other.gguf")
    snapshot = link.parent / "m.gguf"
    with pytest.raises(ModelFileError) as err:
        models.resolve_model("hf:o/r/m.gguf@main")
    assert str(err.value) == (f"model 'hf:o/r/m.gguf@main' is not downloaded: {snapshot} does not exist; "
                              "run `hf download o/r m.gguf --revision main`")
    link.resolve().unlink()  # an interrupted download: the link points at no blob
    with pytest.raises(ModelFileError) as err:
        models.resolve_model("hf:o/r/other.gguf")
    assert str(err.value) == (f"model 'hf:o/r/other.gguf' is not downloaded: {link} does not exist; "
                              "run `hf download o/r other.gguf`")


def test_hf_ref_without_a_commit_and_a_file_that_is_not_gguf_are_refused(home):
    link = hf_model(hf_hub_cache(), "o/r", "m.gguf", b"\x00\x01\x02\x03rest")
    with pytest.raises(ModelFileError) as err:
        models.resolve_model("hf:o/r/m.gguf")
    assert str(err.value) == (f"model 'hf:o/r/m.gguf': {link} is not a GGUF file "
                              "(it starts with b'\\x00\\x01\\x02\\x03', not b'GGUF')")
    ref = hf_hub_cache() / "models--o--r" / "refs" / "main"
    ref.write_text("not-a-commit\n")
    with pytest.raises(ModelFileError) as err:
        models.resolve_model("hf:o/r/m.gguf")
    assert str(err.value) == f"model 'hf:o/r/m.gguf': {ref} holds no commit hash (got 'not-a-commit')"


# --- LM Studio ---

def test_lmstudio_folders_in_order(home, tmp_path, monkeypatch):
    current, legacy = home / ".lmstudio" / "models", home / ".cache" / "lm-studio" / "models"
    assert lmstudio_models_dirs() == (current, legacy)
    old = lmstudio_model(legacy, "lmstudio-community/Qwen-GGUF/Qwen-Q4_K_M.gguf")
    assert models.resolve_model("lmstudio:lmstudio-community/Qwen-GGUF/Qwen-Q4_K_M.gguf") == old
    new = lmstudio_model(current, "lmstudio-community/Qwen-GGUF/Qwen-Q4_K_M.gguf")
    assert models.resolve_model("lmstudio:lmstudio-community/Qwen-GGUF/Qwen-Q4_K_M.gguf") == new
    monkeypatch.setenv("LMSTUDIO_MODELS", str(tmp_path / "elsewhere"))
    assert lmstudio_models_dirs() == (tmp_path / "elsewhere",)
    moved = lmstudio_model(tmp_path / "elsewhere", "lmstudio-community/Qwen-GGUF/Qwen-Q4_K_M.gguf")
    assert models.resolve_model("lmstudio:lmstudio-community/Qwen-GGUF/Qwen-Q4_K_M.gguf") == moved


def test_lmstudio_repository_with_one_gguf_file(home):
    folder = home / ".lmstudio" / "models"
    only = lmstudio_model(folder, "pub/one/One-Q8_0.gguf")
    lmstudio_model(folder, "pub/one/README.md", b"# readme")
    assert models.resolve_model("lmstudio:pub/one") == only
    lmstudio_model(folder, "pub/two/Two-Q4_K_M.gguf")
    lmstudio_model(folder, "pub/two/Two-Q8_0.gguf")
    with pytest.raises(ModelFileError) as err:
        models.resolve_model("lmstudio:pub/two")
    assert str(err.value) == (f"model 'lmstudio:pub/two': {folder / 'pub/two'} holds 2 .gguf files "
                              "(Two-Q4_K_M.gguf, Two-Q8_0.gguf): name one, as lmstudio:pub/two/FILE.gguf")


def test_lmstudio_model_not_downloaded_names_the_get_command(home):
    (home / ".lmstudio" / "models" / "pub" / "empty").mkdir(parents=True)
    for spec in ("lmstudio:pub/empty", "lmstudio:pub/empty/M.gguf"):
        with pytest.raises(ModelFileError) as err:
            models.resolve_model(spec)
        assert str(err.value) == (
            f"model {spec!r} is not downloaded: {spec.removeprefix('lmstudio:')} is in none of LM Studio's models "
            f"folders ({home / '.lmstudio/models'}, {home / '.cache/lm-studio/models'}); run `lms get pub/empty`")


# --- every source ---

@pytest.mark.parametrize(("spec", "form"), [
    *((spec, OLLAMA_FORM) for spec in ("ollama:", "ollama:a/b/c/d", "ollama:../x", "ollama:x:", "ollama:x:a:b",
                                       "ollama:a//b")),
    *((spec, HF_FORM) for spec in ("hf:o/m.gguf", "hf:o/r/m.bin", "hf:o/r/../m.gguf", "hf:o/r/m.gguf@../x")),
    *((spec, LMSTUDIO_FORM) for spec in ("lmstudio:pub", "lmstudio:p/r/m.bin", "lmstudio:p/r/sub/m.gguf",
                                         "lmstudio:p/..")),
])
def test_a_spec_not_of_its_form_is_an_unknown_model(spec, form):
    with pytest.raises(UnknownModelError) as err:
        models.resolve_model(spec)
    assert str(err.value) == f"model {spec!r} is not of the form {form}"


def test_only_the_sources_prefixes_are_source_specs():
    assert [is_source_spec(s) for s in ("ollama:m", "hf:o/r/m.gguf", "lmstudio:p/r", "qwen2.5-coder-1.5b:torch-fp32",
                                        "ollama", "m.gguf", "ngram")] == [True, True, True, False, False, False, False]
    with pytest.raises(UnknownModelError) as err:
        resolve_source("m.gguf")
    assert str(err.value) == ("model 'm.gguf' names no model source: the sources are ollama:NAME[:TAG], "
                              "hf:OWNER/REPO/FILE.gguf[@REVISION], lmstudio:PUBLISHER/REPO[/FILE.gguf]")


def test_the_unknown_model_message_names_the_sources():
    with pytest.raises(UnknownModelError) as err:
        models.resolve_model("gpt-9")
    assert str(err.value) == (
        f"unknown model 'gpt-9': known models are {', '.join(models.DEFAULT_POOL)}; a path to a .gguf file works "
        "too, and so do ollama:NAME[:TAG], hf:OWNER/REPO/FILE.gguf[@REVISION], lmstudio:PUBLISHER/REPO[/FILE.gguf]")


def test_a_source_spec_is_its_own_name_and_never_a_torch_name():
    assert [models.model_name(s) for s in ("ollama:qwen2.5-coder:0.5b", "hf:o/r/m.gguf@main", "lmstudio:p/r",
                                           "qwen2.5-coder-0.5b", "/models/Qwen-Q4.gguf")] == [
        "ollama:qwen2.5-coder:0.5b", "hf:o/r/m.gguf@main", "lmstudio:p/r", "qwen2.5-coder-0.5b", "Qwen-Q4"]
    assert split_torch_name("ollama:qwen2.5-coder:0.5b") is None
    assert split_torch_name("hf:o/r/m.gguf") is None


def test_the_command_line_names_the_fetch_command(home):
    result = CliRunner().invoke(main, ["generate", "--prompt", "x", "--chain", "ngram,ollama:qwen2.5-coder:0.5b"])
    manifest = home / ".ollama/models/manifests/registry.ollama.ai/library/qwen2.5-coder/0.5b"
    assert result.exit_code == 2
    assert result.output == (f"error: model 'ollama:qwen2.5-coder:0.5b' is not downloaded: {manifest} does not exist; "
                             "run `ollama pull qwen2.5-coder:0.5b`\n")
