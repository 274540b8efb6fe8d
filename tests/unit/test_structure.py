"""The shape of the code, read from its source: no import cycle inside `app/` or
`workers/`; the roots (one per process) imported only by entry points and other roots;
one place that calls a diffusers pipeline; the request read by attribute; and the map in
docs/architecture.md naming every job kind and every broker backend there is."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# The root of each process over the base (app/services.py): API, GPU worker, webhook
# worker, relay.
ROOTS = {
    "app.services",
    "app.web.root",
    "workers.runtime",
    "app.webhooks.worker",
    "app.housekeeping.relay",
}
# Who may build or use a root at run time: the entry points and the roots themselves.
ENTRY_POINTS = ("cli", "tasks", "app.web.factory", "celeryconfig")


def _name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules(*packages: str) -> dict[str, Path]:
    return {_name(p): p for package in packages for p in sorted((REPO / package).rglob("*.py"))}


def runtime_imports(path: Path) -> set[str]:
    """Every module `path` imports when it runs (functions' imports included; imports
    under `if TYPE_CHECKING:` are only for the type checker and left out)."""
    tree = ast.parse(path.read_text(), str(path))
    typing_only = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for statement in node.body
        for inner in ast.walk(statement)
    }
    module = _name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            found.add(source)
            found |= {f"{source}.{alias.name}" for alias in node.names}
    return found


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle_inside_app_or_workers():
    for package in ("app", "workers"):
        modules = _modules(package)
        graph = {
            name: {m for m in runtime_imports(path) if m in modules and m != name}
            for name, path in modules.items()
        }
        assert sum(len(edges) for edges in graph.values()) > len(modules) // 2  # read them
        assert _cycles(graph) == [], package


def _package(module: str) -> str:
    """The package a module of `app` belongs to: `app.jobs` for `app.jobs.view`; a
    module directly under `app` (`app.catalog`) is a package of its own."""
    return ".".join(module.split(".")[:2])


def _package_graph() -> dict[str, set[str]]:
    """Which of app's packages each imports at run time. The composition roots are left
    out: a root composes a process from every layer (and only entry points and other
    roots import one, below)."""
    modules = _modules("app")
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        if name in ROOTS:
            continue
        own = _package(name)
        found = {_package(m) for m in runtime_imports(path) if m in modules}
        graph.setdefault(own, set()).update(found - {own})
    return graph


def _reach(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = [start]
    while todo:
        for other in graph.get(todo.pop(), ()):
            if other not in seen:
                seen.add(other)
                todo.append(other)
    return seen


def test_no_import_cycle_between_the_packages_of_app():
    """Each feature's package depends one way on those below it (docs/structure.md,
    "Layers"): a cycle would make a change in either side a change in both."""
    graph = _package_graph()
    assert len(graph) > 15 and sum(map(len, graph.values())) > len(graph)  # read them
    assert _cycles(graph) == []


def test_persistence_and_the_broker_sit_below_the_job_domain():
    graph = _package_graph()
    # The schema imports no domain: its enums are its own (app/db/enums.py), and a row's
    # typed request is read by app.kinds `job_request`, not by the row.
    assert _reach(graph, "app.db") <= {"app.ids"}, _reach(graph, "app.db")
    # The broker publishes and reads messages; what repairs jobs (dead letters) or reads
    # them (the gauges) sits above it and uses it.
    below = _reach(graph, "app.broker")
    assert below.isdisjoint({"app.jobs", "app.gauges", "app.batches", "app.webhooks"}), below


def test_a_cycle_is_found_where_there_is_one():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_only_entry_points_and_roots_import_a_root():
    modules = _modules("app", "workers", "tasks", "cli")
    modules["celeryconfig"] = REPO / "celeryconfig.py"
    assert set(modules) >= ROOTS
    offenders = []
    for name, path in modules.items():
        if name in ROOTS or name.startswith(ENTRY_POINTS):
            continue
        offenders += [f"{name} -> {m}" for m in sorted(runtime_imports(path) & ROOTS)]
    assert offenders == []


def test_one_place_calls_a_diffusers_pipeline():
    """A denoising call is the one that passes a step callback; only workers/call.py
    makes one (a warm-up and a benchmark go through it too)."""
    callers = []
    for name, path in _modules("app", "workers", "tasks", "cli").items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and any(
                k.arg == "callback_on_step_end" for k in node.keywords
            ):
                callers.append(name)
    # workers/synthetic.py is a stand-in pipeline: it calls callbacks, not pipelines.
    assert callers == ["workers.call"]


def test_the_request_is_read_by_attribute():
    """No `params["steps"]`, `job.input["seed"]` or `.get("...")` on a request dict
    outside the request type (app/kinds)."""
    pattern = re.compile(r"""(params|input|first|request)(\[["']|\.get\(["'])""")
    found = [
        f"{path.relative_to(REPO)}:{number}: {line.strip()}"
        for name, path in _modules("app", "workers", "tasks").items()
        if not name.startswith("app.kinds")
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert found == []


def test_the_largest_worker_modules_stay_small():
    for name in ("execute", "batch", "run", "gather"):
        lines = len((REPO / "workers" / f"{name}.py").read_text().splitlines())
        assert lines <= 200, f"workers/{name}.py has {lines} lines"


def test_the_map_names_every_job_kind_and_every_broker_backend():
    from app.broker.backend import BACKENDS, backend_classes
    from app.kinds import KINDS

    architecture = (REPO / "docs" / "architecture.md").read_text()
    for kind in KINDS.values():
        module = type(kind).__module__.replace(".", "/") + ".py"
        assert f"`{kind.name}`" in architecture and module in architecture, kind.name
    for cls, target in zip(backend_classes(), BACKENDS.values(), strict=True):
        module = target.partition(":")[0].replace(".", "/") + ".py"
        assert module in architecture and cls.__name__ in architecture, module
    for heading in ("How to add a job kind", "How to add a broker"):
        assert heading in architecture


def test_every_path_the_map_names_exists():
    """docs/architecture.md's paths of the code (`app/jobs/view.py`, `workers/`) are
    where it says: a module moved or removed without the map fails here."""
    architecture = (REPO / "docs" / "architecture.md").read_text()
    roots = ("app/", "workers/", "tasks/", "cli/", "testbed/", "bench/", "diffq/", "tests/")
    named = {
        path
        for path in re.findall(r"`([a-z_]+/[A-Za-z0-9_./-]*)`", architecture)
        if path.startswith(roots)
    }
    assert len(named) > 40 and "app/jobs/view.py" in named  # the map was read
    missing = sorted(path for path in named if not (REPO / path).exists())
    assert missing == [], missing
