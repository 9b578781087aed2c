"""Sizes held: no module of the package over 450 lines, no class over 300, no function over 80,
measured on its source with `ast` (nothing is imported).

A module's size is its number of lines; a class's or a function's runs from its `class` or
`def` line to its last line (decorators left out), its docstring, comments and blank lines in
(a method counts within its class and on its own). What breaks a bound is listed in EXCEPTIONS
with the reason, or split along its responsibilities.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "specrouter"
MAX_MODULE, MAX_CLASS, MAX_FUNCTION = 450, 300, 80
#: "path/to/module.py" or "path/to/module.py:Qualified.name" -> why it may stay over its bound.
EXCEPTIONS: dict[str, str] = {}


@dataclass(frozen=True)
class Size:
    where: str  # "cascade/chain.py" or "cascade/chain.py:Chain.__post_init__"
    lines: int
    bound: int

    def __str__(self) -> str:
        return f"{self.where}: {self.lines} lines (bound {self.bound})"


def sizes(path: Path, name: str) -> list[Size]:
    """The module's size and every class's and function's in it, nested ones included."""
    text = path.read_text()
    out = [Size(name, len(text.splitlines()), MAX_MODULE)]

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                qualified = f"{prefix}{child.name}"
                bound = MAX_CLASS if isinstance(child, ast.ClassDef) else MAX_FUNCTION
                out.append(Size(f"{name}:{qualified}", child.end_lineno - child.lineno + 1, bound))
                visit(child, qualified + ".")
            else:
                visit(child, prefix)

    visit(ast.parse(text, str(path)), "")
    return out


def measured(package: Path = PACKAGE) -> list[Size]:
    return [s for path in sorted(package.rglob("*.py")) for s in sizes(path, path.relative_to(package).as_posix())]


def test_nothing_is_over_its_bound_but_the_listed_exceptions():
    over = [str(s) for s in measured() if s.lines > s.bound and s.where not in EXCEPTIONS]
    assert over == []


def test_every_exception_is_still_over_its_bound():
    over = {s.where for s in measured() if s.lines > s.bound}
    assert [where for where in EXCEPTIONS if where not in over] == []


def test_the_measure_counts_lines_from_the_definition_to_its_end(tmp_path):
    source = tmp_path / "specrouter" / "m.py"
    source.parent.mkdir()
    long_body = "".join(f"        x = {i}\n" for i in range(80))
    source.write_text("import os\n\n\n@decorator\nclass A:\n    '''doc'''\n\n    def short(self):\n        pass\n\n"
                      f"    def long(self):\n{long_body}\n"
                      "    async def nested(self):\n        def inner():\n            pass\n")
    found = {s.where: s.lines for s in measured(source.parent)}
    assert found == {"m.py": 95, "m.py:A": 91, "m.py:A.short": 2, "m.py:A.long": 81, "m.py:A.nested": 3,
                     "m.py:A.nested.inner": 2}
    assert [str(s) for s in measured(source.parent) if s.lines > s.bound] == ["m.py:A.long: 81 lines (bound 80)"]
