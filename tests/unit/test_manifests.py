"""deploy/ offline: every overlay renders and validates against the Kubernetes schemas,
each role carries what production needs, the scaling and routing overlays say what they
mean, and the Prometheus rules, KEDA queries and dashboard parse and use exported names.
(That the manifests' commands really run: tests/e2e/test_deployment.py.)"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from functools import cache
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
OVERLAYS = sorted(p.name for p in (DEPLOY / "k8s" / "overlays").iterdir() if p.is_dir())
# Custom resources: no schema in kubernetes-validate; checked field by field below.
CRD_GROUPS = ("keda.sh/",)


@cache
def render(overlay: str) -> list[dict]:
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed: cannot render the kustomize overlays")
    out = subprocess.run(
        ["kubectl", "kustomize", str(DEPLOY / "k8s" / "overlays" / overlay)],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def of_kind(docs, kind):
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def container(doc) -> dict:
    return doc["spec"]["template"]["spec"]["containers"][0]


@cache
def exported_metrics() -> set[str]:
    """Every diffq_* series name the code exports (counters add _total, histograms
    _bucket/_sum/_count)."""
    names: set[str] = set()
    for path in [*ROOT.glob("app/**/*.py"), *ROOT.glob("workers/**/*.py")]:
        text = path.read_text()
        for kind, name in re.findall(
            r"(Counter|Histogram|Gauge\w*)\(\s*\"(diffq_[a-z0-9_]+)\"", text
        ):
            if kind == "Counter":
                names.add(f"{name}_total")
            elif kind == "Histogram":
                names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
            else:
                names.add(name)
    return names


def promql_names(expr: str) -> set[str]:
    import promql_parser

    names: set[str] = set()

    def visit(node):
        if isinstance(node, promql_parser.VectorSelector) and node.name:
            names.add(node.name)

    # Grafana's template variables are not PromQL.
    promql_parser.walk(promql_parser.parse(re.sub(r"\$\{?\w+\}?", "x", expr)), visit)
    return names


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_renders_and_validates_against_the_kubernetes_schemas(overlay):
    import kubernetes_validate

    version = kubernetes_validate.latest_version()
    docs = render(overlay)
    checked = 0
    for doc in docs:
        if doc["apiVersion"].startswith(CRD_GROUPS):
            continue
        kubernetes_validate.validate(doc, version, strict=True)
        checked += 1
    for extra in ("secret.example.yaml", "models-loader.yaml"):  # applied by hand (README)
        for doc in yaml.safe_load_all((DEPLOY / "k8s" / extra).read_text()):
            kubernetes_validate.validate(doc, version, strict=True)
    print(f"{overlay}: {checked} objects valid for Kubernetes {version}")
    assert all(d["metadata"].get("namespace") == "diffq" for d in docs)
    images = {c["image"] for d in of_kind(docs, "Deployment").values() for c in [container(d)]}
    assert all(image.startswith("registry.example.com/") for image in images), images


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_role_is_there_with_probes_limits_and_no_root(overlay):
    docs = render(overlay)
    deployments = of_kind(docs, "Deployment")
    runs = {" ".join(container(d)["command"][1:2]) for d in deployments.values()}
    assert {"api", "worker", "webhooks", "relay", "flower"} <= runs, runs
    assert container(of_kind(docs, "Job")["diffq-migrate"])["command"] == ["diffq", "db", "upgrade"]
    for name, doc in [*deployments.items(), *of_kind(docs, "Job").items()]:
        pod = doc["spec"]["template"]["spec"]
        main = container(doc)
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        assert main["securityContext"]["allowPrivilegeEscalation"] is False, name
        assert main["resources"]["requests"]["cpu"] and main["resources"]["limits"]["memory"], name
        if doc["kind"] == "Deployment":
            assert "livenessProbe" in main, name
    api = container(deployments["diffq-api"])
    assert api["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert api["livenessProbe"]["httpGet"]["path"] == "/healthz"
    hpa = of_kind(docs, "HorizontalPodAutoscaler")["diffq-api"]
    kinds = {m["type"]: m for m in hpa["spec"]["metrics"]}
    assert kinds["Resource"]["resource"]["name"] == "cpu"
    assert kinds["Pods"]["pods"]["metric"]["name"] in exported_metrics()
    relay = deployments["diffq-relay"]
    assert relay["spec"]["replicas"] == 1 and relay["spec"]["strategy"]["type"] == "Recreate"
    flower = of_kind(docs, "Service")["diffq-flower"]
    assert flower["spec"]["type"] == "ClusterIP"
    auth = {e["name"]: e for e in container(deployments["diffq-flower"]).get("env", [])}
    assert "secretKeyRef" in auth["DIFFQ_FLOWER_AUTH"]["valueFrom"]
    budgets = [
        p["spec"]["selector"]["matchLabels"] for p in of_kind(docs, "PodDisruptionBudget").values()
    ]
    for name, doc in deployments.items():
        labels = doc["spec"]["template"]["metadata"]["labels"]
        if name in ("diffq-relay", "diffq-flower"):
            continue  # one replica: a budget would block every drain
        assert any(b.items() <= labels.items() for b in budgets), f"{name} has no PDB"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_gpu_workers_get_a_gpu_shm_models_and_a_drain_within_a_spot_notice(overlay):
    docs = render(overlay)
    claims = of_kind(docs, "PersistentVolumeClaim")
    workers = [
        d for d in of_kind(docs, "Deployment").values() if container(d)["command"][1] == "worker"
    ]
    assert workers
    for doc in workers:
        pod = doc["spec"]["template"]["spec"]
        main = container(doc)
        name = doc["metadata"]["name"]
        assert main["resources"]["limits"]["nvidia.com/gpu"] == 1, name
        assert any(t["key"] == "nvidia.com/gpu" for t in pod["tolerations"]), name
        assert pod["nodeSelector"], name
        volumes = {v["name"]: v for v in pod["volumes"]}
        mounts = {m["mountPath"]: m for m in main["volumeMounts"]}
        assert volumes[mounts["/dev/shm"]["name"]]["emptyDir"]["medium"] == "Memory", name
        models = volumes[mounts["/models"]["name"]]["persistentVolumeClaim"]
        assert mounts["/models"]["readOnly"] and models["claimName"] in claims, name
        env = {e["name"]: e.get("value") for e in main["env"]}
        grace = int(env["DIFFQ_SHUTDOWN_GRACE"])
        # The job's grace, then its hand-back (next step + a database write), within 30 s.
        assert grace + 10 <= pod["terminationGracePeriodSeconds"] <= 30, name
        probe = main["livenessProbe"]["httpGet"]
        assert probe["path"] == "/healthz" and probe["port"] == "metrics", name
        assert env["DIFFQ_WORKER_METRICS_PORT"] == str(
            {p["name"]: p["containerPort"] for p in main["ports"]}["metrics"]
        )
    if overlay == "models-readonly":
        (doc,) = workers
        claim = claims["diffq-models-ro"]
        assert claim["spec"]["accessModes"] == ["ReadOnlyMany"]
        assert claim["spec"]["dataSource"]["kind"] == "VolumeSnapshot"
        volumes = doc["spec"]["template"]["spec"]["volumes"]
        assert any(
            v.get("persistentVolumeClaim", {}).get("claimName") == "diffq-models-ro"
            for v in volumes
        )


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_only_the_webhook_workers_reach_the_internet(overlay):
    policies = of_kind(render(overlay), "NetworkPolicy")
    open_to_all = []
    for policy in policies.values():
        for rule in policy["spec"].get("egress", []):
            if any(
                peer.get("ipBlock", {}).get("cidr") == "0.0.0.0/0" for peer in rule.get("to", [])
            ):
                open_to_all.append(policy["spec"]["podSelector"])
    assert open_to_all == [{"matchLabels": {"app": "diffq-webhooks"}}], open_to_all
    deny = policies["diffq-default-deny"]["spec"]
    assert set(deny["policyTypes"]) == {"Ingress", "Egress"} and "egress" not in deny
    # The default deny selects every diffq pod: the label is on every pod template.
    for doc in of_kind(render(overlay), "Deployment").values():
        assert doc["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/part-of"] == "diffq"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_keda_scales_each_pool_on_what_is_queued_for_it(overlay):
    docs = render(overlay)
    deployments = of_kind(docs, "Deployment")
    scaled = of_kind(docs, "ScaledObject")
    workers = {n for n, d in deployments.items() if container(d)["command"][1] == "worker"}
    assert {s["spec"]["scaleTargetRef"]["name"] for s in scaled.values()} == workers
    for name, obj in scaled.items():
        triggers = obj["spec"]["triggers"]
        command = container(deployments[obj["spec"]["scaleTargetRef"]["name"]])["command"]
        crons = [t for t in triggers if t["type"] == "cron"]
        assert not crons or overlay == "peak-hours", (overlay, crons)
        for cron in crons:  # a known peak, held on weekday mornings
            assert int(cron["metadata"]["desiredReplicas"]) > obj["spec"]["minReplicaCount"]
            assert cron["metadata"]["timezone"] and cron["metadata"]["start"].endswith("1-5")
        metrics = [t for t in triggers if t["type"] != "cron"]
        prometheus = [t for t in metrics if t["type"] == "prometheus"]
        # Every pool scales on what is queued for it; the main pool on the forecast too.
        assert len(metrics) == 1 or (len(prometheus) == 2 and name == "diffq-worker-sdxl")
        for trigger in prometheus[1:]:
            query = trigger["metadata"]["query"]
            assert promql_names(query) == {"diffq_demand_forecast_gpus"}, query
            assert promql_names(query) <= exported_metrics()
            assert trigger["metadata"]["threshold"] == "1"  # a worker per GPU
            assert re.search(r'queue="([^"]+)"', query).group(1) == "gpu.sdxl"
        trigger = metrics[0]
        if trigger["type"] == "prometheus":
            query = trigger["metadata"]["query"]
            assert promql_names(query) <= exported_metrics(), query
            assert "diffq_queue_backlog_gpu_seconds" in promql_names(query)
            queue = re.search(r'queue="([^"]+)"', query).group(1)
            assert float(trigger["metadata"]["activationThreshold"]) >= 0
        else:
            assert overlay == "keda-rabbitmq"
            meta = trigger["metadata"]
            assert (trigger["type"], meta["mode"], meta["protocol"]) == (
                "rabbitmq",
                "QueueLength",
                "http",
            )
            queue = meta["queueName"]
            auth = of_kind(docs, "TriggerAuthentication")[trigger["authenticationRef"]["name"]]
            secrets = yaml.safe_load_all((DEPLOY / "k8s" / "secret.example.yaml").read_text())
            keys = {k for s in secrets if s for k in s["stringData"]}
            assert {ref["key"] for ref in auth["spec"]["secretTargetRef"]} <= keys
        # The queue scaled on is one this pool consumes.
        if "--queues" in command:
            assert queue in command[command.index("--queues") + 1].split(",")
        else:
            assert queue == "gpu.sdxl", (name, queue)


def test_spot_overlay_routes_high_priority_to_on_demand_and_scales_spot_to_zero(tmp_path):
    from app.catalog import load_catalog
    from app.config import load_settings

    docs = render("spot")
    models = tmp_path / "models.toml"
    models.write_text(of_kind(docs, "ConfigMap")["diffq"]["data"]["models.toml"])
    catalog = load_catalog(
        load_settings({"DIFFQ_HOME": str(tmp_path), "DIFFQ_MODELS_FILE": str(models)})
    )
    spec = catalog.get("sdxl")
    high, normal = spec.queue_for("high"), spec.queue_for("normal")
    assert high != normal
    pools = {}
    for doc in of_kind(docs, "Deployment").values():
        command = container(doc)["command"]
        if command[1] == "worker":
            queues = command[command.index("--queues") + 1].split(",")
            capacity = doc["spec"]["template"]["spec"]["nodeSelector"]["karpenter.sh/capacity-type"]
            pools[capacity] = (doc["metadata"]["name"], queues)
    assert pools["on-demand"][1] == [high] and pools["spot"][1] == [normal], pools
    scaled = {
        s["spec"]["scaleTargetRef"]["name"]: s["spec"]
        for s in of_kind(docs, "ScaledObject").values()
    }
    assert scaled[pools["spot"][0]]["minReplicaCount"] == 0
    assert scaled[pools["on-demand"][0]]["minReplicaCount"] >= 1


def test_prometheus_rules_parse_and_use_exported_metrics():
    doc = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yaml").read_text())
    rules = [rule for group in doc["groups"] for rule in group["rules"]]
    assert rules and all(set(g) <= {"name", "rules", "interval", "limit"} for g in doc["groups"])
    for rule in rules:
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations", "keep_firing_for"}
        assert rule["labels"]["severity"] in ("page", "ticket") and rule["annotations"]["runbook"]
        names = promql_names(rule["expr"])
        assert names and names <= exported_metrics(), (rule["alert"], names - exported_metrics())
    promtool = shutil.which("promtool")
    if promtool is None:
        print("promtool not installed: rules checked with promql-parser only")
    else:
        subprocess.run(
            [promtool, "check", "rules", str(DEPLOY / "prometheus" / "alerts.yaml")], check=True
        )
    print(f"{len(rules)} alerting rules parse")


def test_dashboard_queries_parse_and_use_exported_metrics():
    dashboard = json.loads((DEPLOY / "grafana" / "diffq-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    exprs += [v["query"]["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    used: set[str] = set()
    for expr in exprs:
        if expr.startswith("label_values("):
            used.add(re.match(r"label_values\((\w+)", expr).group(1))
        else:
            used |= promql_names(expr)
    assert used and used <= exported_metrics(), used - exported_metrics()


def test_compose_has_every_role_and_provisions_prometheus_and_grafana():
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())["services"]
    ours = {name: s for name, s in compose.items() if "build" in s}
    runs = {s["command"][1] for s in ours.values()}
    assert runs == {"db", "api", "relay", "webhooks", "worker", "flower"}
    assert all("healthcheck" in s for n, s in ours.items() if n != "migrate")
    assert "management" in compose["rabbitmq"]["image"]
    assert {"postgres", "s3", "prometheus", "grafana"} <= set(compose)
    prometheus = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    mounted = {v.split(":")[1]: v.split(":")[0] for v in compose["prometheus"]["volumes"]}
    for rule_file in prometheus["rule_files"]:
        assert (DEPLOY / mounted[rule_file]).resolve() == DEPLOY / "prometheus" / "alerts.yaml"
    targets = {
        t
        for job in prometheus["scrape_configs"]
        for c in job["static_configs"]
        for t in c["targets"]
    }
    assert {t.split(":")[0] for t in targets} <= set(compose)
    grafana = {v.split(":")[1]: v.split(":")[0] for v in compose["grafana"]["volumes"]}
    dashboards = yaml.safe_load(
        (DEPLOY / "grafana" / "provisioning" / "dashboards" / "diffq.yaml").read_text()
    )
    folder = dashboards["providers"][0]["options"]["path"]
    assert any(
        inside.startswith(folder) and src.endswith(".json") for inside, src in grafana.items()
    )
    assert grafana["/etc/grafana/provisioning"] == "./grafana/provisioning"
