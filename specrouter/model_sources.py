"""GGUF models where other tools keep them: Ollama's models folder, the Hugging Face hub cache
and LM Studio's models folder. Nothing is downloaded: a model that is not there is a
ModelFileError naming the command that fetches it.

A spec is a source's prefix, then the model as that tool names it:

- `ollama:NAME[:TAG]` (TAG default `latest`; NAME may be NAMESPACE/NAME or HOST/NAMESPACE/NAME,
  as `ollama pull` takes it): the manifest `manifests/HOST/NAMESPACE/NAME/TAG` (HOST default
  registry.ollama.ai, NAMESPACE default library) in $OLLAMA_MODELS, else ~/.ollama/models; its
  layer of media type application/vnd.ollama.image.model names the file `blobs/sha256-<hex>`.
- `hf:OWNER/REPO/FILE.gguf[@REVISION]` (FILE may lie in a folder of the repository): in the hub
  cache ($HF_HUB_CACHE, else $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else
  ~/.cache/huggingface/hub), `models--OWNER--REPO/refs/REVISION` (default main) holds a commit
  and the file is `snapshots/<commit>/FILE`; a REVISION of 40 hex digits is a commit itself.
  The snapshot's link is returned, not the blob it points to: a split GGUF's other parts are
  found by their names beside it.
- `lmstudio:PUBLISHER/REPO/FILE.gguf`, or `lmstudio:PUBLISHER/REPO` for a folder that holds one
  .gguf file: `PUBLISHER/REPO/FILE.gguf` in $LMSTUDIO_MODELS, else in ~/.lmstudio/models, then
  in the older ~/.cache/lm-studio/models.

Every file found must begin with the GGUF magic. A spec not of its source's form is an
UnknownModelError; a missing model, a manifest that cannot be used and a file that is not GGUF
are ModelFileErrors.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from specrouter.errors import ModelFileError, UnknownModelError

GGUF_MAGIC = b"GGUF"
#: The media type of the layer of an Ollama manifest that holds the weights.
OLLAMA_MODEL_LAYER = "application/vnd.ollama.image.model"

OLLAMA_FORM = "ollama:NAME[:TAG]"
HF_FORM = "hf:OWNER/REPO/FILE.gguf[@REVISION]"
LMSTUDIO_FORM = "lmstudio:PUBLISHER/REPO[/FILE.gguf]"

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")  # one name of a path: never "", "." or ".."
_DIGEST = re.compile(r"sha256:([0-9a-f]{64})")
_COMMIT = re.compile(r"[0-9a-f]{40}")
_HF = re.compile(r"([^/@]+)/([^/@]+)/([^@]+\.gguf)(?:@(.+))?", re.IGNORECASE)


@dataclass(frozen=True)
class ModelSource:
    prefix: str  # what a spec begins with, before the colon
    form: str  # the spec's form, as messages show it
    find: Callable[[str, str], Path]  # (spec, what follows the prefix) -> the GGUF file


def source_of(spec: str) -> ModelSource | None:
    """The source a spec names by its prefix; None for any other spec."""
    prefix, colon, _ = spec.partition(":")
    return SOURCES.get(prefix) if colon else None


def is_source_spec(spec: str) -> bool:
    return source_of(spec) is not None


def resolve_source(spec: str) -> Path:
    """The GGUF file a source spec names (the errors are the module's)."""
    source = source_of(spec)
    if source is None:
        raise UnknownModelError(f"model {spec!r} names no model source: the sources are "
                                f"{', '.join(s.form for s in SOURCES.values())}")
    return source.find(spec, spec.partition(":")[2])


def _env_dir(variable: str) -> Path | None:
    value = os.environ.get(variable)
    return Path(value).expanduser() if value else None


def ollama_models_dir() -> Path:
    return _env_dir("OLLAMA_MODELS") or Path.home() / ".ollama" / "models"


def hf_hub_cache() -> Path:
    if (hub := _env_dir("HF_HUB_CACHE")) is not None:
        return hub
    if (home := _env_dir("HF_HOME")) is not None:
        return home / "hub"
    return (_env_dir("XDG_CACHE_HOME") or Path.home() / ".cache") / "huggingface" / "hub"


def lmstudio_models_dirs() -> tuple[Path, ...]:
    """The folders searched, in order."""
    if (models := _env_dir("LMSTUDIO_MODELS")) is not None:
        return (models,)
    return Path.home() / ".lmstudio" / "models", Path.home() / ".cache" / "lm-studio" / "models"


def _malformed(spec: str, form: str) -> UnknownModelError:
    return UnknownModelError(f"model {spec!r} is not of the form {form}")


def _names(spec: str, text: str, form: str) -> list[str]:
    """The names of a slash-separated path; UnknownModelError for an empty, `.` or `..` one."""
    names = text.split("/")
    if not all(_NAME.fullmatch(n) for n in names):
        raise _malformed(spec, form)
    return names


def _not_downloaded(spec: str, path: Path, fetch: str) -> ModelFileError:
    return ModelFileError(f"model {spec!r} is not downloaded: {path} does not exist; run `{fetch}`")


def _gguf(spec: str, path: Path, fetch: str) -> Path:
    """`path` once it opens and begins with the GGUF magic."""
    try:
        with open(path, "rb") as f:
            head = f.read(len(GGUF_MAGIC))
    except FileNotFoundError:
        raise _not_downloaded(spec, path, fetch) from None
    except OSError as e:
        raise ModelFileError(f"model {spec!r}: cannot read {path}: {e.strerror or e}") from None
    if head != GGUF_MAGIC:
        raise ModelFileError(f"model {spec!r}: {path} is not a GGUF file (it starts with {head!r}, not {GGUF_MAGIC!r})")
    return path


def _ollama(spec: str, rest: str) -> Path:
    name, colon, tag = rest.partition(":")
    tag = tag if colon else "latest"
    names = _names(spec, name, OLLAMA_FORM)
    if len(names) > 3 or not _NAME.fullmatch(tag):
        raise _malformed(spec, OLLAMA_FORM)
    fetch = f"ollama pull {name}:{tag}"
    folder = ollama_models_dir()
    manifest = folder.joinpath("manifests", *["registry.ollama.ai", "library"][: 3 - len(names)], *names, tag)
    try:
        text = manifest.read_text()
    except FileNotFoundError:
        raise _not_downloaded(spec, manifest, fetch) from None
    except (OSError, UnicodeDecodeError) as e:
        raise ModelFileError(f"model {spec!r}: cannot read the Ollama manifest {manifest}: {e}") from None
    return _gguf(spec, folder / "blobs" / f"sha256-{_model_digest(spec, manifest, text)}", fetch)


def _model_digest(spec: str, manifest: Path, text: str) -> str:
    """The hex sha256 of the manifest's model layer."""
    try:
        data = json.loads(text)
    except ValueError as e:
        raise ModelFileError(f"model {spec!r}: the Ollama manifest {manifest} is not valid JSON ({e})") from None
    layers = data.get("layers") if isinstance(data, dict) else None
    models = [layer for layer in layers if isinstance(layer, dict) and layer.get("mediaType") == OLLAMA_MODEL_LAYER] \
        if isinstance(layers, list) else []
    if not models:
        raise ModelFileError(f"model {spec!r}: the Ollama manifest {manifest} has no layer of media type "
                             f"{OLLAMA_MODEL_LAYER}")
    digest = models[0].get("digest")
    found = _DIGEST.fullmatch(digest) if isinstance(digest, str) else None
    if found is None:
        raise ModelFileError(f"model {spec!r}: the model layer of the Ollama manifest {manifest} has no "
                             f"sha256:<64 hex digits> digest (got {digest!r})")
    return found.group(1)


def _hf(spec: str, rest: str) -> Path:
    found = _HF.fullmatch(rest)
    if found is None:
        raise _malformed(spec, HF_FORM)
    owner, repo, file, revision = found.groups()
    for part in (owner, repo, file, *([revision] if revision is not None else [])):
        _names(spec, part, HF_FORM)
    fetch = f"hf download {owner}/{repo} {file}" + (f" --revision {revision}" if revision is not None else "")
    folder = hf_hub_cache() / f"models--{owner}--{repo}"
    ref = folder / "refs" / (revision or "main")
    try:
        commit = ref.read_text().strip()
    except FileNotFoundError:
        if revision is None or not _COMMIT.fullmatch(revision):
            raise _not_downloaded(spec, ref, fetch) from None
        commit = revision
    except (OSError, UnicodeDecodeError) as e:
        raise ModelFileError(f"model {spec!r}: cannot read {ref}: {e}") from None
    if not _COMMIT.fullmatch(commit):
        raise ModelFileError(f"model {spec!r}: {ref} holds no commit hash (got {commit[:80]!r})")
    return _gguf(spec, folder / "snapshots" / commit / file, fetch)


def _lmstudio(spec: str, rest: str) -> Path:
    names = _names(spec, rest, LMSTUDIO_FORM)
    if len(names) not in (2, 3) or (len(names) == 3 and not names[2].lower().endswith(".gguf")):
        raise _malformed(spec, LMSTUDIO_FORM)
    fetch = f"lms get {names[0]}/{names[1]}"
    folders = lmstudio_models_dirs()
    for folder in folders:
        path = folder.joinpath(*names) if len(names) == 3 else _only_gguf(spec, folder.joinpath(*names))
        if path is not None and path.exists():
            return _gguf(spec, path, fetch)
    raise ModelFileError(f"model {spec!r} is not downloaded: {'/'.join(names)} is in none of LM Studio's models "
                         f"folders ({', '.join(map(str, folders))}); run `{fetch}`")


def _only_gguf(spec: str, repo: Path) -> Path | None:
    """The one .gguf file of a repository's folder; None where there is none."""
    files = sorted(p.name for p in repo.iterdir() if p.name.lower().endswith(".gguf")) if repo.is_dir() else []
    if len(files) > 1:
        raise ModelFileError(f"model {spec!r}: {repo} holds {len(files)} .gguf files ({', '.join(files)}): "
                             f"name one, as {spec}/FILE.gguf")
    return repo / files[0] if files else None


SOURCES: dict[str, ModelSource] = {
    source.prefix: source
    for source in (
        ModelSource("ollama", OLLAMA_FORM, _ollama),
        ModelSource("hf", HF_FORM, _hf),
        ModelSource("lmstudio", LMSTUDIO_FORM, _lmstudio),
    )
}
