"""The layers as drawn, kept: cli -> control -> (rl, evals, report, serve) -> client/types/renderers -> engine ->
models; the store only under the control plane; no module cycles. Imports are read from the source (every
`import`, at module top or inside a function), so a change cannot undo this silently.

KNOWN lists what is still to be taken apart (empty since issue 15 took apart the two rollout pipelines, the loop's
reach into the engine and the tool-call type); the test fails when one of them is fixed and still listed, so the
list only shrinks. ALLOWED names the exceptions the design wants, each with its reason. Imports inside functions
must say why they are there."""

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
MODULES = {".".join(f.relative_to(SRC).with_suffix("").parts).removesuffix(".__init__"): f
           for f in (SRC / "strop").rglob("*.py")}
API_SURFACE = {"types", "client", "local_backend", "renderers", "model_info", "tokenizer_utils", "tool_calls"}
# (importing package, imported package) pairs that must not appear, with the rule each breaks
FORBIDDEN = {
    **{(p, "store"): "the store is the control plane's" for p in
       ("cli", "rl", "evals", "report", "serve", "ui", "client", "types", "renderers", "engine", "models", "scoring",
        "data", "envs", "sft", "tinker_wire")},
    **{("tinker_wire", p): "the tinker server is handed what it needs from the control plane" for p in
       ("control", "cli", "rl", "sft", "evals")},
    **{("engine", p): "the engine serves the layers above it" for p in
       ("rl", "sft", "evals", "control", "cli", "serve", "report", "client", "renderers", "scoring", "envs", "data")},
    **{("evals", p): "evaluation is used by the control plane, not the other way" for p in ("control", "cli")},
    **{(loop, p): "the loop is used by the control plane, not the other way" for loop in ("rl", "sft")
       for p in ("control", "cli", "evals")},
    **{(p, q): "the API surface does not reach up or into environments" for p in API_SURFACE for q in
       ("envs", "rl", "sft", "evals", "control", "cli", "serve", "report", "scoring")},
    **{(loop, p): "the loop reaches the engine and the models through the client" for loop in ("rl", "sft")
       for p in ("engine", "models")},
}
# Imports a rule above would refuse but the design wants, with why.
ALLOWED: dict = {}   # none: the name tables the loop's settings read are in the leaf strop.choices (issue 38)
KNOWN: set = set()   # what is still to be taken apart; empty
KNOWN_CYCLES = set()


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "strop"


def _resolve(name: str) -> str:
    while name not in MODULES and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def imports() -> dict[str, set[str]]:
    """module -> the strop modules it imports (`from pkg import submodule` counts as the submodule)."""
    found = {}
    for module, path in MODULES.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("strop"):
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    targets.add(full if full in MODULES else _resolve(node.module))
            elif isinstance(node, ast.Import):
                targets.update(_resolve(a.name) for a in node.names if a.name.startswith("strop"))
        found[module] = targets - {module}
    return found


def test_no_import_goes_against_the_layers():
    broken = {}
    for module, targets in imports().items():
        for target in targets:
            rule = FORBIDDEN.get((_package(module), _package(target)))
            if rule:
                broken[(module, target)] = rule
    new = {pair: rule for pair, rule in broken.items() if pair not in KNOWN and pair not in ALLOWED}
    assert not new, "imports against the layers:\n" + "\n".join(f"{a} -> {b}: {r}" for (a, b), r in sorted(new.items()))
    assert KNOWN <= set(broken), f"fixed, so take them out of KNOWN: {sorted(KNOWN - set(broken))}"


def test_no_module_cycles():
    graph = imports()
    cycles, index, low, stack, on_stack = [], {}, {}, [], set()

    def visit(node):  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(frozenset(component))

    for node in graph:
        if node not in index:
            visit(node)
    new = set(cycles) - KNOWN_CYCLES
    assert not new, f"module cycles: {[sorted(c) for c in new]}"
    assert KNOWN_CYCLES <= set(cycles), f"fixed, so take them out of KNOWN_CYCLES: {KNOWN_CYCLES - set(cycles)}"


def test_the_checks_see_a_forbidden_import(tmp_path, monkeypatch):
    """The reader finds imports inside functions too: a planted one is caught."""
    planted = tmp_path / "trainer.py"
    planted.write_text("def f():\n    from strop.control import runs\n")
    monkeypatch.setitem(MODULES, "strop.engine.planted", planted)
    assert "strop.control.runs" in imports()["strop.engine.planted"]
    try:
        test_no_import_goes_against_the_layers()
    except AssertionError as exc:
        assert "strop.engine.planted -> strop.control.runs" in str(exc)
    else:
        raise AssertionError("a forbidden import went unnoticed")


def test_imports_inside_functions_say_why():
    """Imports sit at module top; one inside a function is there for a reason (a heavy or optional dependency
    the module does not need to be imported, a cycle, a platform, a process that must start small), and says
    it in a comment on its line, or above the run of imports it belongs to."""
    silent = []
    for module, path in MODULES.items():
        lines = path.read_text().split("\n")
        tree = ast.parse("\n".join(lines))
        for function in ast.walk(tree):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for block in ast.walk(function):
                body = [s for field in ("body", "orelse", "finalbody")
                        if isinstance(getattr(block, field, None), list) for s in getattr(block, field)]
                runs, current = [], []
                for statement in body:
                    if isinstance(statement, (ast.Import, ast.ImportFrom)):
                        current.append(statement)
                    elif current:
                        runs.append(current)
                        current = []
                runs += [current] if current else []
                for run in runs:
                    said = any("#" in lines[s.lineno - 1] for s in run) or \
                        lines[run[0].lineno - 2].strip().startswith("#")
                    if not said:
                        silent.append(f"{path.relative_to(SRC)}:{run[0].lineno}: {ast.unparse(run[0])}")
    assert not silent, "imports inside functions with no reason given:\n" + "\n".join(sorted(set(silent)))


def test_every_module_imports_first_in_a_fresh_interpreter():
    """An import cycle through a package's __init__ only breaks when its modules are met in a certain order (it
    broke `import strop.evals` while every test passed): each module is imported first, with every strop module
    forgotten before it, in one subprocess (torch and the rest stay loaded, so this takes seconds)."""
    import subprocess
    import sys
    elsewhere = {"strop.__main__",                 # runs the CLI
                 "strop.engine.vllm_worker",        # runs in vLLM's own environment (STROP_VLLM_PYTHON)
                 "strop.store.migrations.env"}      # run by alembic, which gives it its context
    names = sorted(n for n in MODULES if n not in elsewhere)
    program = ("import importlib, sys, traceback\n"
               f"failed = []\nfor name in {names!r}:\n"
               "    for loaded in [m for m in sys.modules if m == 'strop' or m.startswith('strop.')]:\n"
               "        del sys.modules[loaded]\n"
               "    try:\n        importlib.import_module(name)\n"
               "    except Exception as exc:\n        failed.append(f'{name}: {exc!r}')\n"
               "print('\\n'.join(failed))\n")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=600,
                          env={**__import__("os").environ, "PYTHONPATH": str(SRC)})
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "", f"modules that fail when imported first:\n{done.stdout}"


def _members(path: Path, class_name: str) -> set[str]:
    """What a class declares: its methods, properties and class attributes, and every `self.NAME =` of its methods."""
    tree = ast.parse(path.read_text())
    cls = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == class_name)
    names = set()
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    for node in ast.walk(cls):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) \
            else []
        names.update(t.attr for t in targets if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)
                     and t.value.id == "self")
    return names


def test_every_engine_and_trainer_declares_the_whole_interface():
    """The client speaks to sampling engines and trainers through strop.engine.interface and never probes them
    (getattr/hasattr): so every implementation must have every member, the ones that cannot be built here (vLLM,
    Ray) checked in their source."""
    from strop.engine.interface import SAMPLING_ENGINE_MEMBERS, TRAINER_MEMBERS
    engines = {("strop.engine.sampler", "SamplerEngine"), ("strop.engine.vllm_engine", "VllmEngine"),
               ("strop.cluster.samplers", "RaySamplerEngine")}
    trainers = {("strop.engine.trainer", "LoraTrainer"), ("strop.cluster.trainer", "RemoteTrainer")}
    for kinds, wanted in ((engines, SAMPLING_ENGINE_MEMBERS), (trainers, TRAINER_MEMBERS)):
        for module, name in sorted(kinds):
            missing = sorted(set(wanted) - _members(MODULES[module], name))
            assert not missing, f"{module}.{name} lacks {missing}"
    client = MODULES["strop.client"].read_text() + MODULES["strop.local_backend"].read_text()
    assert "getattr(queue.engine" not in client and "hasattr(self.trainer" not in client


MAX_FILE_LINES = 450      # a module a reader holds in their head (nanochat's files stay under ~600)
MAX_FUNCTION_LINES = 100  # a function a reader sees whole; longer ones are split into named steps


def test_no_file_or_function_is_too_long_to_read_whole():
    """Every module under MAX_FILE_LINES and every function under MAX_FUNCTION_LINES (database migrations, which
    are generated and never edited after they ship, aside)."""
    long_files, long_functions = [], []
    for path in sorted((SRC / "strop").rglob("*.py")):
        if "migrations" in path.parts:
            continue
        text = path.read_text()
        name = path.relative_to(SRC).as_posix()
        if text.count("\n") > MAX_FILE_LINES:
            long_files.append(f"{name}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    long_functions.append(f"{name}:{node.lineno} {node.name}: {length} lines")
    assert long_files == [] and long_functions == [], "\n".join(long_files + long_functions)
