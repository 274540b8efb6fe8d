"""The shipped alerting as the programs that run it read it: promtool checks the rules and
compose's Prometheus configuration and runs the rules' unit tests
(deploy/prometheus/tests/), every alert has a test that fires it and one that holds it
back, and amtool routes each alert to the receiver of its severity.

(That the alerts fire on a running diffq, reach Alertmanager and clear:
tests/e2e/test_monitoring.py.)"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
RULES = DEPLOY / "prometheus" / "alerts.yaml"
RULE_TESTS = sorted((DEPLOY / "prometheus" / "tests").glob("*.yaml"))
ALERTMANAGER = DEPLOY / "alertmanager" / "alertmanager.yml"


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(
            f"{name} is not installed: scripts/monitoring installs it with apt-get as root "
            "(Debian's prometheus and prometheus-alertmanager)"
        )
    return path


def _run(*args: str) -> str:
    done = subprocess.run(args, capture_output=True, text=True, timeout=120)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    return output


def _alert_rules() -> dict[str, dict]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return {rule["alert"]: rule for group in groups for rule in group["rules"] if "alert" in rule}


def _minutes(duration: str) -> float:
    units = {"s": 1 / 60, "m": 1, "h": 60}
    return sum(float(n) * units[u] for n, u in re.findall(r"(\d+)([smh])", duration))


def _compose() -> dict:
    return yaml.safe_load((DEPLOY / "compose.yaml").read_text())["services"]


def test_promtool_checks_the_rules_and_the_configuration_compose_runs(tmp_path):
    promtool = _tool("promtool")
    print(_run(promtool, "check", "rules", str(RULES)).strip())
    # prometheus.yml as compose mounts it: its rule file at the path the volume gives it.
    config = (DEPLOY / "prometheus" / "prometheus.yml").read_text()
    for volume in _compose()["prometheus"]["volumes"]:
        source, inside = volume.split(":")[:2]
        if source.startswith("./") and inside in config:
            config = config.replace(inside, str((DEPLOY / source).resolve()))
    (tmp_path / "prometheus.yml").write_text(config)
    out = _run(promtool, "check", "config", str(tmp_path / "prometheus.yml"))
    assert f"SUCCESS: {len(_alert_rules())} rules found" in out, out
    print(out.strip())


def test_promtool_unit_tests_of_every_alert_pass():
    promtool = _tool("promtool")
    assert RULE_TESTS, "no promtool tests in deploy/prometheus/tests/"
    out = _run(promtool, "test", "rules", *map(str, RULE_TESTS))
    assert out.count("SUCCESS") == len(RULE_TESTS), out
    print(out.strip())


def test_every_alert_is_tested_firing_with_its_labels_and_held_back_until_its_for():
    """Each alert: a test group where it is silent at one evaluation and fires, with its
    severity, at a later one close enough to pin its `for:`; every test names a real
    alert and loads the shipped rules."""
    rules = _alert_rules()
    covered: dict[str, list[str]] = {name: [] for name in rules}
    for path in RULE_TESTS:
        doc = yaml.safe_load(path.read_text())
        assert [(path.parent / f).resolve() for f in doc["rule_files"]] == [RULES], path
        for group in doc["tests"]:
            by_alert: dict[str, list[tuple[float, list]]] = {}
            for case in group["alert_rule_test"]:
                assert case["alertname"] in rules, (path.name, case["alertname"])
                by_alert.setdefault(case["alertname"], []).append(
                    (_minutes(case["eval_time"]), case["exp_alerts"])
                )
            for name, cases in by_alert.items():
                rule = rules[name]
                for _at, alerts in cases:
                    for alert in alerts:
                        assert alert["exp_labels"]["severity"] == rule["labels"]["severity"]
                        assert set(alert["exp_annotations"]) == set(rule["annotations"]), name
                firing = [at for at, alerts in cases if alerts]
                silent = [at for at, alerts in cases if not alerts]
                if not silent:
                    continue
                if not firing:
                    covered[name].append("held back")
                    continue
                before = [at for at in silent if at < min(firing)]
                # Silent at most two evaluations before it fires, and firing no sooner
                # than its `for:` allows: the test pins `for:`.
                if (
                    before
                    and min(firing) - max(before) <= 2
                    and min(firing) >= _minutes(rule.get("for", "0m"))
                ):
                    covered[name].append("fires after its for")
                else:
                    covered[name].append("held back")
    missing = {name: kinds for name, kinds in covered.items() if "fires after its for" not in kinds}
    assert not missing, f"alerts without a test that pins their for: and fires them: {missing}"
    print(f"{len(rules)} alerts, each tested: {covered}")


def test_alertmanager_routes_every_alert_to_the_receiver_of_its_severity():
    amtool = _tool("amtool")
    print(_run(amtool, "check-config", str(ALERTMANAGER)).strip())
    config = yaml.safe_load(ALERTMANAGER.read_text())
    receivers = {r["name"] for r in config["receivers"]}
    for name, rule in _alert_rules().items():
        severity = rule["labels"]["severity"]
        assert severity in receivers, (name, severity)
        done = subprocess.run(
            [
                *(amtool, "config", "routes", "test", f"--config.file={ALERTMANAGER}"),
                *(f"alertname={name}", f"severity={severity}", "queue=gpu.sdxl"),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.stdout.strip() == severity, (name, done.stdout, done.stderr)
    # Every receiver sends the resolution too: an operator sees the alert end.
    for receiver in config["receivers"]:
        for hook in receiver["webhook_configs"]:
            assert hook["send_resolved"] is True, receiver["name"]


def test_compose_runs_prometheus_and_alertmanager_with_the_shipped_files():
    compose = _compose()
    prometheus = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    (target,) = [
        t
        for am in prometheus["alerting"]["alertmanagers"]
        for c in am["static_configs"]
        for t in c["targets"]
    ]
    host, port = target.split(":")
    manager = compose[host]
    mounted = {v.split(":")[1]: v.split(":")[0] for v in manager["volumes"]}
    config_flag = next(a for a in manager["command"] if a.startswith("--config.file="))
    source = mounted[config_flag.split("=", 1)[1]]
    assert (DEPLOY / source).resolve() == ALERTMANAGER
    # Alertmanager's default listen port, which the command does not change.
    assert port == "9093" and not any("web.listen" in a for a in manager["command"])
    assert host in compose["prometheus"]["depends_on"]
