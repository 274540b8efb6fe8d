"""Import boundaries that keep the API light and the domain framework-free."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("torch", "diffusers", "transformers", "workers")


def _modules_after(code: str, env=None, *, whole: bool = False) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport sys; print(' '.join(sorted(sys.modules)))"],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    ).stdout
    return set(out.split()) if whole else {name.split(".")[0] for name in out.split()}


def test_the_api_process_never_imports_torch_diffusers_or_workers(tmp_path):
    import os

    env = {**os.environ, "DIFFQ_HOME": str(tmp_path)}
    for key in [k for k in env if k.startswith("DIFFQ_") and k != "DIFFQ_HOME"]:
        env.pop(key)
    loaded = _modules_after(
        "from app.web.factory import create_app\n"
        "app = create_app()\n"
        "c = app.test_client(); c.get('/openapi.json'); c.post('/v1/jobs', json={})",
        env=env,
        whole=True,
    )
    assert not {name.split(".")[0] for name in loaded} & set(HEAVY), loaded & set(HEAVY)
    # An add-on's worker half (app/addons/<name>/worker.py) is the worker's alone.
    assert "app.addons" in loaded  # the API reads every add-on's request part
    halves = sorted(n for n in loaded if n.startswith("app.addons.") and n.endswith(".worker"))
    assert halves == [], halves


def test_the_domain_imports_neither_flask_nor_torch():
    loaded = _modules_after(
        "import app, app.config, app.catalog, app.jobs.service, app.broker.payload, "
        "app.storage, app.keys, app.broker.publish, app.db.models, app.jobs.view"
    )
    assert not loaded & {"flask", "flask_smorest", *HEAVY}


def test_workers_import_no_flask():
    loaded = _modules_after(
        "import workers.execute, workers.runtime, workers.call, workers.supervisor"
    )
    assert not loaded & {"flask", "flask_smorest", "werkzeug"}


def test_the_state_machine_does_not_import_webhooks():
    """transitions tells app/jobs/changes.py's listeners; webhooks subscribe themselves."""
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import app.jobs.transitions, sys; print(' '.join(sorted(sys.modules)))",
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    assert "app.jobs.transitions" in loaded
    assert not [name for name in loaded if name.startswith("app.webhooks")]


# Every process that changes jobs, by the module its entry point imports first: each
# builds its state through the composition root (app/services.py), which subscribes the
# webhook listener; without it, that process's changes would send no webhooks.
STATE_CHANGING_ENTRY_POINTS = (
    "app.web.factory",  # the API: cancel, cache hits
    "workers.runtime",  # GPU worker pool process: claim, progress, outcome
    "tasks.boot.gpu",  # GPU worker main process: a hard time limit's failure
    "tasks.celery_app",  # `celery -A tasks dlq|requeue`, webhook workers
    "cli.serve",  # `diffq relay`: reaping, deadlines, aging, retention
    "cli.operators",  # `diffq dlq|requeue`: dead-letter purge and requeue
    "cli.admin",  # `diffq keys|tenants|db`
    "cli.up",  # the embedded mode
)


def test_every_process_that_changes_jobs_subscribes_the_webhook_listener():
    check = (
        "import importlib, sys\n"
        "importlib.import_module(sys.argv[1])\n"
        "from app.jobs import changes\n"
        "print(' '.join(f'{f.__module__}.{f.__qualname__}' for f in changes.listeners()))"
    )
    running = {
        module: subprocess.Popen(
            [sys.executable, "-c", check, module], stdout=subprocess.PIPE, text=True
        )
        for module in STATE_CHANGING_ENTRY_POINTS
    }
    subscribed = {module: proc.communicate()[0].split() for module, proc in running.items()}
    assert all(proc.returncode == 0 for proc in running.values()), subscribed
    missing = [
        m for m, names in subscribed.items() if "app.webhooks.events.record_change" not in names
    ]
    assert not missing, f"no webhook listener after importing {missing}"


def test_no_module_of_app_imports_workers_tasks_or_the_cli():
    """Read from the source, so an import inside a function counts too."""
    import ast
    from pathlib import Path

    package = Path(__file__).resolve().parents[2] / "app"
    found = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            found += [
                f"{path.relative_to(package.parent)}: {name}"
                for name in names
                if name.split(".")[0] in {"workers", "tasks", "cli"}
            ]
    assert package.joinpath("services.py").exists()  # the walk saw the package
    assert found == []
