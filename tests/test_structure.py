"""The package's shape: one import direction, one module that reads the environment, the docs in step."""
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


def test_docs_list_every_environment_variable_with_its_default():
    readme = (ROOT / "docs" / "envs.md").read_text()  # the Environment variables page (moved from the README)
    for var in envs.ENVIRONMENT:
        assert f"| `{var.name}` | {var.default} | {var.meaning} |" in readme, var.name


def _code_lines(function) -> list[str]:
    """The statements of a function, without its docstring and comments."""
    import inspect
    import textwrap
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    body = tree.body[0].body
    if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    return [ast.unparse(node) for node in body]


def test_engine_core_step_is_the_articles_three_stages_and_nothing_else():
    from minivllm.engine.core import EngineCore
    code = "\n".join(_code_lines(EngineCore.step))
    assert "trac" not in code and "observer" not in code, code
    calls = [n.func.attr for n in ast.walk(ast.parse(code)) if isinstance(n, ast.Call) and
             isinstance(n.func, ast.Attribute)]
    assert sorted(calls) == ["execute_model", "has_unfinished_requests", "schedule", "update_from_output"], calls


# The fields vLLM 0.22 gives these dataclasses (vllm/forward_context.py, vllm/v1/outputs.py,
# vllm/v1/engine/__init__.py); ours may leave some out, never add one of their own.
VLLM_FIELDS = {
    "ForwardContext": {"no_compile_layers", "attn_metadata", "slot_mapping", "virtual_engine", "dp_metadata",
                       "cudagraph_runtime_mode", "batch_descriptor", "ubatch_slices", "additional_kwargs",
                       "all_moe_layers", "moe_layer_index"},
    "ModelRunnerOutput": {"req_ids", "req_id_to_index", "sampled_token_ids", "logprobs", "prompt_logprobs_dict",
                          "pooler_output", "kv_connector_output", "ec_connector_output", "num_nans_in_logits",
                          "cudagraph_stats"},
    "EngineCoreOutputs": {"engine_index", "outputs", "scheduler_stats", "timestamp", "utility_output",
                          "finished_requests", "wave_complete", "start_wave"},
}


def test_the_dataclasses_the_article_teaches_carry_only_vllms_fields():
    import dataclasses
    from minivllm.engine import EngineCoreOutputs
    from minivllm.forward_context import ForwardContext
    from minivllm.outputs import ModelRunnerOutput
    for cls in (ForwardContext, ModelRunnerOutput, EngineCoreOutputs):
        ours = {f.name for f in dataclasses.fields(cls)}
        assert ours <= VLLM_FIELDS[cls.__name__], (cls.__name__, ours - VLLM_FIELDS[cls.__name__])


def test_no_module_is_over_250_lines():
    long = {str(p.relative_to(ROOT)): n for p in PACKAGE.rglob("*.py") if (n := len(p.read_text().splitlines())) > 250}
    assert not long, f"split these modules (250 lines at most): {long}"


def test_ipc_messages_are_typed_dataclasses_dispatched_by_type():
    """No (kind, payload) tuple crosses the process boundary: every message is one of engine/__init__'s classes."""
    import dataclasses
    import inspect

    from minivllm import engine
    from minivllm.engine import core, core_client, utils
    messages = {"AddRequests", "AbortRequests", "UtilityCall", "Shutdown", "EngineCoreReady", "EngineCoreOutputs",
                "UtilityOutput", "EngineCoreFailed", "TraceEvents"}
    assert all(dataclasses.is_dataclass(getattr(engine, name)) for name in messages)
    for module in (core, core_client, utils):
        tree = ast.parse(inspect.getsource(module))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, (ast.Attribute, ast.Name)) and \
                    getattr(node.func, "attr", getattr(node.func, "id", None)) in ("send", "put") and node.args:
                assert not isinstance(node.args[0], ast.Tuple), f"{module.__name__}:{node.lineno} sends a tuple"
