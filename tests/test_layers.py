"""The package's layers, as the README's "Layout of the code" draws them: each folder imports only
its own layer and those below it (an import inside a function or under ``TYPE_CHECKING`` counts
too), and no module imports itself back through others, at import time or later."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "rlinfra"
LAYERS = ("config", "placement", "runtime", "services", "engines", "views", "driver", "ops", "cli")


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path) for path in PACKAGE.rglob("*.py")}


def _imported(node: ast.AST, package: str) -> list[str]:
    """The rlinfra modules an import statement loads (relative ones resolved against ``package``;
    ``from rlinfra.x import y`` loads ``rlinfra.x.y`` when that is a module, else ``rlinfra.x``)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom):
        anchor = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
        base = ".".join([*anchor, *([node.module] if node.module else [])])
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
    else:
        return []
    return [name for name in names if name.startswith("rlinfra")]


def _edges(path: Path) -> tuple[set[str], set[str], set[str]]:
    """Every rlinfra module ``path`` imports, those it imports as it is itself imported, and
    those it may import when it runs (all but the ``TYPE_CHECKING`` ones: annotations only)."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    every = {name for node in ast.walk(tree) for name in _imported(node, package)}
    eager = {name for node in tree.body for name in _imported(node, package)}
    typing_only = {
        id(node)
        for block in tree.body
        if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
        for node in ast.walk(block)
    }
    running = {
        name for node in ast.walk(tree) if id(node) not in typing_only for name in _imported(node, package)
    }
    return every, eager, running


EDGES = {_module_name(path): _edges(path) for path in sorted(PACKAGE.rglob("*.py"))}


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else ""


@pytest.mark.parametrize("module", sorted(name for name in EDGES if _layer(name)))
def test_a_module_imports_only_its_layer_and_those_below(module: str) -> None:
    allowed = LAYERS[: LAYERS.index(_layer(module)) + 1]
    above = sorted(name for name in EDGES[module][0] if _layer(name) and _layer(name) not in allowed)
    assert not above, f"{module} reaches up into {above}"


@pytest.mark.parametrize("when", [1, 2], ids=["at import time", "at run time"])
def test_no_module_imports_itself_back(when: int) -> None:
    """Not at import time (a crash), and not later: an import inside a function that closes a
    circle hides a layer that should have been split."""
    eager = {module: {name for name in edges[when] if name in EDGES} for module, edges in EDGES.items()}
    for start in eager:
        seen: set[str] = set()
        stack = [(start, [start])]
        while stack:
            module, path = stack.pop()
            for name in eager[module]:
                assert name != start, "import circle: " + " -> ".join([*path, name])
                if name not in seen:
                    seen.add(name)
                    stack.append((name, [*path, name]))
