"""The package's shape: one import direction, one module that reads the environment, the README in step."""
from __future__ import annotations

import ast
from pathlib import Path

from minivllm import envs

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "minivllm"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every minivllm module this file imports, at any depth (function-level imports count too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("minivllm")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("minivllm"):
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return found


def test_no_import_cycle_in_the_package():
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {name: {m for m in _imports(path) if m in modules and m != name} for name, path in modules.items()}
    # a package's __init__ re-exporting its own modules is not a cycle of the code's dependencies
    graph = {n: {m for m in deps if not (n.startswith(m + ".") and modules[m].name == "__init__.py")}
             for n, deps in graph.items()}
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycle = path[path.index(nxt):] + [nxt] if nxt in path else [node, nxt]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])


def test_only_envs_reads_the_environment():
    readers = []
    for path in PACKAGE.rglob("*.py"):
        if path.name == "envs.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv") and \
                    isinstance(node.value, ast.Name) and node.value.id == "os":
                readers.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not readers, f"os.environ read outside minivllm/envs.py: {readers}"


def test_readme_lists_every_environment_variable_with_its_default():
    readme = (ROOT / "README.md").read_text()
    for name, (default, meaning) in envs.VARIABLES.items():
        assert f"| `{name}` | {default} | {meaning} |" in readme, name
