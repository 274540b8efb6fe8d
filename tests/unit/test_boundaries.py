"""Import boundaries that keep the API light and the domain framework-free."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("torch", "diffusers", "transformers", "workers")


def _modules_after(code: str, env=None) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport sys; print(' '.join(sorted(sys.modules)))"],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    ).stdout
    return {name.split(".")[0] for name in out.split()}


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
    )
    assert not loaded & set(HEAVY), loaded & set(HEAVY)


def test_the_domain_imports_neither_flask_nor_torch():
    loaded = _modules_after(
        "import app, app.config, app.catalog, app.jobs.service, app.jobs.payload, "
        "app.storage, app.keys, app.broker.publish, app.db.models"
    )
    assert not loaded & {"flask", "flask_smorest", *HEAVY}


def test_workers_import_no_flask():
    loaded = _modules_after(
        "import workers.execute, workers.runtime, workers.generation, workers.supervisor"
    )
    assert not loaded & {"flask", "flask_smorest", "werkzeug"}


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
