"""The README's configuration table and the deploy files agree with the code."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

import pytest
import yaml

from app.catalog import ModelSpec, load_catalog
from app.config import load_settings

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
# Read by scripts or internal hand-offs, not by load_settings().
NOT_SETTINGS = {"DIFFQ_TORCH", "DIFFQ_TEST_PG_URL", "DIFFQ_TEST_AMQP_URL", "DIFFQ_WORKER_QUEUES"}


def _config_table() -> str:
    return README.split("## Configuration", 1)[1].split("\n## ", 1)[0]


def test_every_setting_is_in_the_readme_table_and_nothing_else():
    read = set(re.findall(r'"(DIFFQ_[A-Z0-9_]+)"', (ROOT / "app/config.py").read_text()))
    documented = set(re.findall(r"`(DIFFQ_[A-Z0-9_]+)`", _config_table())) - NOT_SETTINGS
    assert read == documented


def test_the_readme_lists_every_model_key():
    section = README.split("Every key of a `[models.NAME]` table:", 1)[1].split("A request", 1)[0]
    listed = set(re.findall(r"`([a-z_]+)`", section))
    assert {f.name for f in fields(ModelSpec)} - {"name"} <= listed


def test_the_readme_and_the_gpu_notes_name_every_scheduler_of_the_rules_table():
    from app.rules import SCHEDULERS

    section = README.split("`schedulers` (subset of", 1)[1].split(")", 1)[0]
    assert re.findall(r"`([a-z_+]+)`", section) == list(SCHEDULERS)
    notes = (ROOT / "docs/gpu.md").read_text().split("## Schedulers", 1)[1].split("\n## ", 1)[0]
    notes = " ".join(notes.split())  # wrapped lines
    for name, scheduler in SCHEDULERS.items():
        if scheduler.class_name:
            assert f"`{name}` (`{scheduler.class_name}`)" in notes, name


@pytest.mark.parametrize(
    "source",
    ["deploy/models.toml", "deploy/k8s/base/configmap.yaml"],
)
def test_shipped_model_files_are_valid_catalogs(tmp_path, source):
    text = (ROOT / source).read_text()
    if source.endswith(".yaml"):
        text = yaml.safe_load(text)["data"]["models.toml"]
    models = tmp_path / "models.toml"
    models.write_text(text)
    catalog = load_catalog(
        load_settings({"DIFFQ_HOME": str(tmp_path), "DIFFQ_MODELS_FILE": str(models)})
    )
    assert catalog.models


def test_deploy_manifests_parse_and_only_set_known_settings():
    known = set(re.findall(r'"(DIFFQ_[A-Z0-9_]+)"', (ROOT / "app/config.py").read_text()))
    for path in sorted((ROOT / "deploy").rglob("*.yaml")):
        text = path.read_text()
        assert list(yaml.safe_load_all(text)), path
        used = set(re.findall(r"\b(DIFFQ_[A-Z0-9_]+)\b", text))
        assert used <= known, (path, used - known)


def test_the_fault_count_the_readme_claims_is_the_sum_of_the_scenarios_floors():
    from tests.faults.harness import FLOORS

    total = sum(FLOORS.values())
    assert total >= 300, "the README says a passing fault run injects over 300"
    assert f"{total} in all, `FLOORS` in `tests/faults/harness.py`" in README
    assert "has injected over 300" in README
    # Every fault scenario of the suite has a floor, and every floor a scenario.
    names = set()
    for path in (ROOT / "tests" / "faults").glob("test_*.py"):
        names |= {
            m.upper().replace("B", "b")
            for m in re.findall(r"^def test_(f\d+b?)_", path.read_text(), re.M)
        }
    assert names == set(FLOORS), (sorted(names), sorted(FLOORS))


def test_the_deployed_broker_and_workers_agree_on_the_consumer_timeout():
    """compose's RabbitMQ closes an unacknowledged delivery's channel after the same time
    the workers' catalog check assumes, and Kubernetes names the value its broker needs."""
    compose = yaml.safe_load((ROOT / "deploy/compose.yaml").read_text())
    setting = int(compose["x-diffq-env"]["DIFFQ_BROKER_CONSUMER_TIMEOUT"])
    args = compose["services"]["rabbitmq"]["environment"]["RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS"]
    assert f"-rabbit consumer_timeout {setting * 1000}" in args
    configmap = yaml.safe_load((ROOT / "deploy/k8s/base/configmap.yaml").read_text())
    k8s = int(configmap["data"]["DIFFQ_BROKER_CONSUMER_TIMEOUT"])
    assert (
        f"consumer_timeout = {k8s * 1000}" in (ROOT / "deploy/k8s/base/configmap.yaml").read_text()
    )
    assert setting == k8s > 1800  # above RabbitMQ's default: a clip runs longer


def test_a_time_limit_past_the_brokers_consumer_timeout_is_refused(tmp_path):
    """Unless the model's jobs checkpoint and run alone: those hand a delivery back before
    the timeout and resume (tests/unit/test_delivery_timeout.py)."""
    from app.catalog import CatalogError

    models = tmp_path / "models.toml"
    table = '[models.wan]\npath = "/m"\nfamily = "wan"\nsoft_time_limit = 3000\ntime_limit = 3300\n'
    models.write_text(table + "checkpoint_seconds = 0\n")
    env = {"DIFFQ_HOME": str(tmp_path), "DIFFQ_MODELS_FILE": str(models)}
    with pytest.raises(CatalogError, match="DIFFQ_BROKER_CONSUMER_TIMEOUT"):
        load_catalog(load_settings(env))
    raised = load_catalog(load_settings({**env, "DIFFQ_BROKER_CONSUMER_TIMEOUT": "7200"}))
    assert raised.models["wan"].time_limit == 3300
    models.write_text(table)  # checkpoints every 60 s, by default
    assert load_catalog(load_settings(env)).models["wan"].spans_deliveries
