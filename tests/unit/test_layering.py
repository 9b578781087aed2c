"""The package's imports, read from its source with `ast` (nothing is imported): no cycle, and
every import points down the layering.

Layers, lowest first. A module may import a module of a lower layer, or of its own group (a
subpackage, or a named group of top-level modules); nothing of its own layer's other groups and
nothing above. Every import counts: at module level, inside a function (a lazy import is still
an arrow) and under `if TYPE_CHECKING:`. Importing `specrouter.a.b` also runs `specrouter.a`
(its `__init__`), so it counts as an import of both.

     0  errors, smoothing,       plain definitions every layer uses: import nothing of the package
        metrics                  (metrics: the speculation counts per level and draft position)
     1  ops, models,             row arithmetic on numpy or torch rows (knows no backend); model
        model_sources, offload,  files and downloads, and the GGUF files other tools downloaded;
        allocator                GPU layer offload; the process's allocator
     2  backends, convert        models behind one interface (a backend registers its row kind
                                 with ops); torch conversion of the pool's files
     3  state, vocab, chat*      what a chain's models share: KV bookkeeping, one tokenizer,
                                 chat prompts
     4  cascade                  one cycle: a model's drafts, verification, sampling parameters
     5  drafters                 the model-free proposers (lookups, the cross-request memory)
     6  router, pool             choosing chains; loading the levels a chain names (beside each
                                 other: neither imports the other)
     7  engine                   requests, cycles, batches, prefill
     8  server, sim, compare     the OpenAI API over the engine; the trace-driven simulator;
                                 methods compared over the user's prompts (`specrouter compare`)
     9  fleet                    replicas of the server (it deploys servers)
    10  cli*                     the command line

That is `backends < cascade < drafters < router < engine < server / fleet / sim / compare <
cli`, with the top-level modules placed and fleet set above the server it deploys. An arrow
against it stands only when listed in EXCEPTIONS with its reason.
"""

from __future__ import annotations

import ast
import graphlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "specrouter"

#: Every top-level module and subpackage of specrouter, by layer (lowest first).
LAYERS: list[tuple[str, ...]] = [
    ("errors", "smoothing", "metrics"),
    ("ops", "models", "model_sources", "offload", "allocator"),
    ("backends", "convert"),
    ("state", "vocab", "chat", "chat_masking", "chat_tokens"),
    ("cascade",),
    ("drafters",),
    ("router", "pool"),
    ("engine",),
    ("server", "sim", "compare"),
    ("fleet",),
    ("cli", "cli_compare", "cli_options", "cli_sim", "cli_torch"),
]
#: Top-level modules that form one group (they may import each other).
GROUPS = {"chat_masking": "chat", "chat_tokens": "chat", "cli_compare": "cli", "cli_options": "cli", "cli_sim": "cli",
          "cli_torch": "cli", "model_sources": "models"}
#: (importer, imported) -> why the arrow may point up. Empty: none may.
EXCEPTIONS: dict[tuple[str, str], str] = {}


@dataclass(frozen=True)
class Arrow:
    importer: str  # dotted module names, "specrouter." left off
    imported: str
    line: int

    def __str__(self) -> str:
        return f"{self.importer} -> {self.imported} (line {self.line})"


def module_names(package: Path) -> dict[str, Path]:
    """Every module of the package by dotted name without the root ("cascade.chain"; a
    subpackage is its __init__: "cascade")."""
    out = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool, modules: dict) -> Iterator[str]:
    """The package's modules an import statement names (resolved, "specrouter." left off)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        if node.level:
            base = module.split(".") if is_package else module.split(".")[:-1]
            base = base[: len(base) - (node.level - 1)]
            source = ".".join(["specrouter", *base, *([node.module] if node.module else [])])
        else:
            source = node.module or ""
        # `from a import b`: b is a module of a, or a name defined in a.
        names = [f"{source}.{a.name}" if f"{source}.{a.name}".removeprefix("specrouter.") in modules else source
                 for a in node.names]
    for name in names:
        if name.startswith("specrouter."):
            yield name.removeprefix("specrouter.")


def arrows(package: Path = PACKAGE) -> list[Arrow]:
    """Every import of one module of the package by another, wherever it stands in the file;
    an import of `a.b.c` is an arrow to a.b.c, a.b and a (running a module runs its packages)."""
    modules = module_names(package)
    out = []
    for module, path in modules.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for target in _targets(node, module, is_package, modules):
                parts = target.split(".")
                for i in range(len(parts), 0, -1):
                    name = ".".join(parts[:i])
                    inside = module == name or module.startswith(name + ".")
                    if name in modules and not inside:
                        out.append(Arrow(module, name, node.lineno))
    return out


def top(module: str) -> str:
    return module.split(".")[0]


def layer_of(module: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if top(module) in layer)


def group_of(module: str) -> str:
    return GROUPS.get(top(module), top(module))


def against_layering(found: list[Arrow]) -> list[Arrow]:
    """Arrows to the importer's own layer (another group) or above it, less the exceptions."""
    return [a for a in found if group_of(a.importer) != group_of(a.imported)
            and layer_of(a.imported) >= layer_of(a.importer) and (a.importer, a.imported) not in EXCEPTIONS]


def cycle(found: list[Arrow]) -> list[str]:
    """One import cycle among the modules ([] when there is none)."""
    graph: dict[str, set[str]] = {}
    for a in found:
        graph.setdefault(a.importer, set()).add(a.imported)
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as exc:
        return list(exc.args[1])
    return []


def test_every_module_of_the_package_has_a_layer():
    listed = [name for layer in LAYERS for name in layer]
    assert len(listed) == len(set(listed))
    tops = {top(m) for m in module_names(PACKAGE) if m}
    assert sorted(tops - set(listed)) == []  # a new top-level module or package: give it a layer
    assert sorted(set(listed) - tops) == []
    assert set(GROUPS) | set(GROUPS.values()) <= set(listed)


def test_the_package_has_no_import_cycle():
    assert cycle(arrows()) == []


def test_every_import_points_down_the_layering():
    assert [str(a) for a in against_layering(arrows())] == []


def test_every_exception_is_still_an_import():
    found = {(a.importer, a.imported) for a in arrows()}
    assert [pair for pair in EXCEPTIONS if pair not in found] == []


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / "specrouter" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "specrouter"


def test_the_reader_finds_cycles_and_arrows_up_however_they_are_written(tmp_path):
    package = _write(tmp_path, {
        "errors.py": "def clip(): pass\n",
        "cascade/__init__.py": "",
        "cascade/chain.py": "from specrouter.errors import clip\n"
                            "def build():\n    from specrouter.drafters.model import Model\n",
        "cascade/rows.py": "from . import verify\n",
        "cascade/verify.py": "import specrouter.cascade.rows\n",
        "drafters/__init__.py": "from specrouter.drafters.model import Model\n",
        "drafters/model.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                             "    from specrouter.router import Router\nclass Model: pass\n",
        "router/__init__.py": "class Router: pass\n",
        "engine/__init__.py": "from ..cascade.chain import build\n",
    })
    found = arrows(package)
    assert sorted(map(str, found)) == [
        "cascade.chain -> drafters (line 3)", "cascade.chain -> drafters.model (line 3)",
        "cascade.chain -> errors (line 1)", "cascade.rows -> cascade.verify (line 1)",
        "cascade.verify -> cascade.rows (line 1)", "drafters -> drafters.model (line 1)",
        "drafters.model -> router (line 3)", "engine -> cascade (line 1)", "engine -> cascade.chain (line 1)"]
    assert sorted(map(str, against_layering(found))) == [
        "cascade.chain -> drafters (line 3)", "cascade.chain -> drafters.model (line 3)",
        "drafters.model -> router (line 3)"]
    assert sorted(cycle(found)[1:]) == ["cascade.rows", "cascade.verify"]


@pytest.mark.parametrize("importer, imported, allowed", [
    ("cli_sim", "cli", True), ("chat", "chat_tokens", True), ("fleet.deploy", "server.run", True),
    ("server.run", "sim.trace", False), ("router.costs", "pool", False), ("backends.torch", "ops.rows_torch", True),
    ("ops.rows_torch", "backends.base", False), ("engine.prefill", "smoothing", True)])
def test_the_layering_of_some_arrows(importer, imported, allowed):
    assert (against_layering([Arrow(importer, imported, 1)]) == []) == allowed
