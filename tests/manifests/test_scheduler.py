"""The second scheduler's manifests: its Deployment, RBAC and ConfigMap, the scraper's RBAC, schemas, the
scheduler pods' network, and the CLI that writes them (the configuration's own fields:
``test_scheduler_configuration.py``)."""

from __future__ import annotations

import re
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from cdk.prometheus import scrape_configuration
from gpu_scheduler.cli import main
from manifests.scheduler import (
    CONFIG_HASH_ANNOTATION,
    EXTENDER_URL_ANNOTATION,
    SCRAPER_USER,
    all_manifests,
    render_yaml,
    scheduler_manifests,
    scraper_rbac,
)
from manifests.scheduler_configuration import scheduler_configuration
from manifests.scheduler_options import SchedulerOptions
from scheduler_core.errors import ConfigError

URL = "https://a1b2c3d4e5.execute-api.us-east-1.amazonaws.com/v1"


def _by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def _embedded_config(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (config_map,) = [doc for doc in _by_kind(docs, "ConfigMap") if "config.yaml" in doc.get("data", {})]
    config: dict[str, Any] = yaml.safe_load(config_map["data"]["config.yaml"])
    return config


def test_the_configmap_carries_the_same_configuration_and_the_pods_roll_when_it_changes() -> None:
    plain = scheduler_manifests(SchedulerOptions(extender_url=URL))
    assert _embedded_config(plain) == scheduler_configuration(SchedulerOptions(extender_url=URL))

    def config_hash(docs: list[dict[str, Any]]) -> str:
        (deployment,) = _by_kind(docs, "Deployment")
        annotation: str = deployment["spec"]["template"]["metadata"]["annotations"][CONFIG_HASH_ANNOTATION]
        return annotation

    assert config_hash(plain) == config_hash(scheduler_manifests(SchedulerOptions(extender_url=URL)))
    assert config_hash(plain) != config_hash(scheduler_manifests(SchedulerOptions(extender_url=URL, weight=6)))


def test_the_digest_is_of_what_stable_text_makes_of_the_configuration_and_the_url_rides_beside_it() -> None:
    """The CDK app's URL is a token whose placeholder changes per synth: ``stable_text`` writes it as what it
    stands for, so only the configuration moves the digest; the URL annotation rolls the pods on a new URL."""

    def annotations(host: str) -> dict[str, str]:
        stable = partial(re.sub, re.escape(host), "HOST")
        (deployment,) = _by_kind(
            scheduler_manifests(SchedulerOptions(extender_url=f"https://{host}/v1"), stable_text=stable), "Deployment"
        )
        found: dict[str, str] = deployment["spec"]["template"]["metadata"]["annotations"]
        return found

    first, second = annotations("a.example"), annotations("b.example")
    assert first[CONFIG_HASH_ANNOTATION] == second[CONFIG_HASH_ANNOTATION]
    assert (first[EXTENDER_URL_ANNOTATION], second[EXTENDER_URL_ANNOTATION]) == (
        "https://a.example/v1",
        "https://b.example/v1",
    )
    plain = _by_kind(scheduler_manifests(SchedulerOptions(extender_url="https://a.example/v1")), "Deployment")[0]
    assert plain["spec"]["template"]["metadata"]["annotations"][CONFIG_HASH_ANNOTATION] != first[CONFIG_HASH_ANNOTATION]


@pytest.mark.parametrize(
    ("tag", "gates"),
    [("v1.33.5", ["--feature-gates=SchedulerAsyncPreemption=false"]), ("v1.34.1", []), ("latest", [])],
    ids=["1.33 preempts synchronously (kubernetes#141694)", "1.34 keeps its defaults", "an unversioned tag too"],
)
def test_the_scheduler_gets_the_feature_gates_of_its_image_version(tag: str, gates: list[str]) -> None:
    docs = scheduler_manifests(SchedulerOptions(extender_url=URL, image=f"registry.k8s.io/kube-scheduler:{tag}"))
    (deployment,) = _by_kind(docs, "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert [flag for flag in container["command"] if flag.startswith("--feature-gates")] == gates


def test_deployment_mounts_the_config_probes_the_secure_port_and_the_pdb_selects_its_pods() -> None:
    docs = scheduler_manifests(SchedulerOptions(extender_url=URL, image="registry.k8s.io/kube-scheduler:v1.34.1"))
    (deployment,) = _by_kind(docs, "Deployment")
    (pdb,) = _by_kind(docs, "PodDisruptionBudget")
    pod = deployment["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    assert container["image"] == "registry.k8s.io/kube-scheduler:v1.34.1"
    assert "--config=/etc/kubernetes/gpu-scheduler/$(GPU_SCHEDULER_CONFIG)" in container["command"]
    assert container["env"] == [{"name": "GPU_SCHEDULER_CONFIG", "value": "config.yaml"}]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": 10259, "scheme": "HTTPS"}
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["resources"]["requests"] == {"cpu": "100m", "memory": "128Mi"}
    assert pod["spec"]["serviceAccountName"] == "gpu-scheduler"
    assert pod["spec"]["volumes"][0]["configMap"]["name"] == _by_kind(docs, "ConfigMap")[0]["metadata"]["name"]
    selector = pdb["spec"]["selector"]["matchLabels"]
    assert selector.items() <= pod["metadata"]["labels"].items()
    assert deployment["spec"]["replicas"] == 2 and pdb["spec"]["maxUnavailable"] == 1


def test_the_scheduler_binds_the_builtin_roles_and_may_renew_only_its_own_lease() -> None:
    docs = scheduler_manifests(SchedulerOptions(extender_url=URL))
    roles = {d["roleRef"]["name"] for d in docs if d["kind"] in ("ClusterRoleBinding", "RoleBinding")}
    assert {"system:kube-scheduler", "system:volume-scheduler", "extension-apiserver-authentication-reader"} <= roles
    (lease_role,) = _by_kind(docs, "Role")
    named = [rule for rule in lease_role["rules"] if "resourceNames" in rule]
    assert named == [
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": ["gpu-scheduler"],
            "verbs": ["get", "update", "patch"],
        }
    ]


# What Prometheus's Kubernetes service discovery lists and watches for each role (one informer per kind,
# prometheus/discovery/kubernetes), as (API group, resource).
SD_ROLE_READS = {
    "pod": {("", "pods")},
    "node": {("", "nodes")},
    "service": {("", "services")},
    "endpoints": {("", "endpoints"), ("", "services"), ("", "pods")},
    "endpointslice": {("discovery.k8s.io", "endpointslices"), ("", "services"), ("", "pods")},
    "ingress": {("networking.k8s.io", "ingresses")},
}
CREDENTIALS = ("authorization", "bearer_token", "bearer_token_file", "oauth2")


def _scrape_needs(config: dict[str, Any]) -> set[tuple[str, str, str]]:
    """(API group or ``nonResourceURL``, resource or path, verb) that a Prometheus scrape configuration reads
    from the API server with the scraper's identity."""
    needs = set()
    for job in config["scrape_configs"]:
        for sd in job.get("kubernetes_sd_configs", []):
            kinds = set(SD_ROLE_READS[sd["role"]])
            if sd.get("attach_metadata", {}).get("node"):
                kinds.add(("", "nodes"))
            needs |= {(group, resource, verb) for group, resource in kinds for verb in ("list", "watch")}
        # A job that presents the scraper's credentials is authorised by its target: the API server (or a
        # component delegating to it) then needs RBAC on the path. Without credentials, nothing is asked.
        if any(key in job for key in CREDENTIALS):
            needs.add(("nonResourceURL", job.get("metrics_path", "/metrics"), "get"))
    return needs


def _rules_grant(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    granted = set()
    for rule in rules:
        if "nonResourceURLs" in rule:
            granted |= {("nonResourceURL", url, verb) for url in rule["nonResourceURLs"] for verb in rule["verbs"]}
        else:
            granted |= {(g, r, v) for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
    return granted


@pytest.mark.parametrize(
    ("dcgm", "ksm"),
    [("gpu-operator", "kube-system"), ("nvidia-gpu", "monitoring")],
    ids=["default namespaces", "other exporter namespaces"],
)
def test_the_scraper_may_read_exactly_what_its_scrape_configuration_reads(dcgm: str, ksm: str) -> None:
    needs = _scrape_needs(scrape_configuration(dcgm_namespace=dcgm, ksm_namespace=ksm))
    assert needs, "the scrape configuration discovers its targets through the API"
    docs = scraper_rbac()
    (role,) = _by_kind(docs, "ClusterRole")
    assert _rules_grant(role["rules"]) == needs
    (binding,) = _by_kind(docs, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": SCRAPER_USER}]
    # What the CLI and the stack apply is this RBAC, not another copy.
    applied = [d for d in all_manifests(SchedulerOptions(extender_url=URL)) if d["metadata"]["name"] ==
               role["metadata"]["name"]]  # fmt: skip
    assert applied == docs


def test_the_scrape_needs_follow_the_discovery_roles_and_credentials() -> None:
    """The derivation above, on configurations that would need more: it must not pass by reading nothing."""
    wider = {
        "scrape_configs": [
            {"job_name": "a", "kubernetes_sd_configs": [{"role": "endpoints", "attach_metadata": {"node": True}}]},
            {"job_name": "apiserver", "kubernetes_sd_configs": [{"role": "node"}], "bearer_token_file": "/t"},
        ]
    }
    assert _scrape_needs(wider) == {
        (g, r, v) for g, r in [("", "endpoints"), ("", "services"), ("", "pods"), ("", "nodes")]
        for v in ("list", "watch")
    } | {("nonResourceURL", "/metrics", "get")}  # fmt: skip


@pytest.mark.parametrize("sharing", [False, True], ids=["whole GPUs", "sharing"])
def test_every_manifest_validates_against_the_kubernetes_schemas(sharing: bool) -> None:
    for doc in all_manifests(SchedulerOptions(extender_url=URL, sharing=sharing)):
        kubernetes_validate.validate(doc, "1.33", strict=True)


def test_bad_options_are_all_named() -> None:
    with pytest.raises(ConfigError) as info:
        SchedulerOptions(extender_url="http://plain", weight=0, http_timeout_s=0, replicas=0).validated()
    for name in ("extender_url: expected an https:// URL", "weight:", "http_timeout_s:", "replicas:"):
        assert name in str(info.value)


def test_yaml_has_no_aliases_and_round_trips() -> None:
    docs = all_manifests(SchedulerOptions(extender_url=URL))
    text = render_yaml(docs, header="line one\n\nline three")
    assert "&id" not in text and "*id" not in text
    assert text.startswith("# line one\n#\n# line three\n")
    assert list(yaml.safe_load_all(text)) == docs


def test_cli_writes_the_manifests_for_a_url(tmp_path: Path) -> None:
    out = tmp_path / "deep" / "gpu-scheduler.yaml"
    assert main(["scheduler-config", "--url", URL, "--sharing", "--weight", "3", "--out", str(out)]) == 0
    docs = list(yaml.safe_load_all(out.read_text()))
    assert docs == all_manifests(SchedulerOptions(extender_url=URL, sharing=True, weight=3))
    assert _embedded_config(docs)["extenders"][1]["bindVerb"] == "bind"


def test_cli_refuses_a_plain_http_url(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["scheduler-config", "--url", "http://10.0.0.1:8888"]) == 2
    assert "extender_url: expected an https:// URL" in capsys.readouterr().err


def test_the_karpenter_nodepools_come_with_a_node_class_and_shares_get_their_own_pool():
    base = SchedulerOptions(extender_url=URL, sharing=True)
    assert not [d for d in all_manifests(base) if d["kind"] == "NodePool"]
    pools = [d for d in all_manifests(replace(base, karpenter_node_class="gpu")) if d["kind"] == "NodePool"]
    assert [p["metadata"]["name"] for p in pools] == ["gpu-whole", "gpu-shared"]
    assert {p["spec"]["template"]["spec"]["nodeClassRef"]["name"] for p in pools} == {"gpu"}
    assert [p["spec"]["disruption"]["consolidationPolicy"] for p in pools] == ["WhenEmpty", "WhenEmpty"]
    loose = replace(base, karpenter_node_class="gpu", karpenter_consolidation="WhenEmptyOrUnderutilized")
    policies = [d["spec"]["disruption"]["consolidationPolicy"] for d in all_manifests(loose) if d["kind"] == "NodePool"]
    assert policies == ["WhenEmptyOrUnderutilized", "WhenEmpty"]  # shares' pool: only empty nodes, always
    problems = replace(base, karpenter_node_class="GPU pool", karpenter_consolidation="Sometimes").problems()
    assert any("karpenter_node_class" in p for p in problems) and any("karpenter_consolidation" in p for p in problems)


SG = "sg-0123456789abcdef0"


def test_a_pod_security_group_puts_the_scheduler_pods_and_no_others_in_it_before_they_start() -> None:
    docs = all_manifests(SchedulerOptions(extender_url=URL, security_group=SG))
    (policy,) = _by_kind(docs, "SecurityGroupPolicy")
    (deployment,) = [d for d in _by_kind(docs, "Deployment") if d["metadata"]["name"] == "gpu-scheduler"]
    # The fields of the VPC resource controller's v1beta1 SecurityGroupPolicySpec: podSelector (a
    # LabelSelector), securityGroups.groupIds.
    assert policy["apiVersion"] == "vpcresources.k8s.aws/v1beta1"
    assert set(policy["spec"]) == {"podSelector", "securityGroups"}
    assert policy["spec"]["securityGroups"] == {"groupIds": [SG]}
    assert policy["metadata"]["namespace"] == deployment["metadata"]["namespace"]
    selector = policy["spec"]["podSelector"]["matchLabels"]
    assert selector.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    assert selector == deployment["spec"]["selector"]["matchLabels"], "the Deployment's own pods, nothing wider"
    # Applied in order: the controller gives a pod its interface when it is created.
    assert docs.index(policy) < docs.index(deployment)
    assert not _by_kind(all_manifests(SchedulerOptions(extender_url=URL)), "SecurityGroupPolicy")


def test_a_node_selector_runs_the_scheduler_pods_on_that_node_group_tolerating_its_taints() -> None:
    options = SchedulerOptions(extender_url=URL, node_selector={"role": "scheduler", "example.com/pool": "sched"})
    docs = all_manifests(options)
    assert not _by_kind(docs, "SecurityGroupPolicy")
    (deployment,) = [d for d in _by_kind(docs, "Deployment") if d["metadata"]["name"] == "gpu-scheduler"]
    spec = deployment["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"role": "scheduler", "example.com/pool": "sched"}
    assert spec["tolerations"] == [
        {"key": "example.com/pool", "operator": "Exists"},
        {"key": "role", "operator": "Exists"},
    ]
    for doc in docs:
        kubernetes_validate.validate(doc, "1.33", strict=True)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"node_selector": {"bad key": "x"}}, "node_selector: expected label keys and values"),
        ({"node_selector": {"a": "-x"}}, "node_selector: expected label keys and values"),
        ({"node_selector": {f"k{i}": "v" for i in range(9)}}, "node_selector: at most 8 labels, got 9"),
        ({"security_group": "sg 1"}, "security_group: expected a security group ID"),
        ({"security_group": "sg-1' || true || '"}, "security_group: expected a security group ID"),
    ],
    ids=[
        "a key with a space",
        "a value starting with a dash",
        "too many labels",
        "a group with a space",
        "CEL in a group",
    ],
)
def test_bad_scheduler_pod_networks_are_named(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        SchedulerOptions(extender_url=URL, **options).validated()


def test_cli_wires_the_scheduler_pods_network_and_warns_without_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "m.yaml"
    assert main(["scheduler-config", "--url", URL, "--security-group", SG, "--out", str(out)]) == 0
    docs = list(yaml.safe_load_all(out.read_text()))
    assert docs == all_manifests(SchedulerOptions(extender_url=URL, security_group=SG))
    assert "warning" not in capsys.readouterr().err
    assert main(["scheduler-config", "--url", URL, "--node-selector", "role=scheduler", "--out", str(out)]) == 0
    assert "warning" not in capsys.readouterr().err
    assert main(["scheduler-config", "--url", URL, "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "warning: neither --security-group nor --node-selector" in err
    assert "WARNING: neither --security-group" in out.read_text()
    # On loopback (serve beside a local kube-scheduler) there is no endpoint to admit anyone: no warning.
    assert main(["scheduler-config", "--url", "http://127.0.0.1:8888", "--out", str(out)]) == 0
    assert "warning" not in capsys.readouterr().err
    assert main(["scheduler-config", "--url", URL, "--node-selector", "role"]) == 2
    assert "--node-selector: expected KEY=VALUE, got 'role'" in capsys.readouterr().err


@pytest.mark.parametrize("sharing", [False, True], ids=["whole GPUs", "sharing"])
def test_the_break_glass_configuration_is_the_same_scheduler_without_the_extender(sharing: bool) -> None:
    options = SchedulerOptions(extender_url=URL, sharing=sharing)
    (config_map,) = [d for d in _by_kind(all_manifests(options), "ConfigMap") if "config.yaml" in d["data"]]
    normal = yaml.safe_load(config_map["data"]["config.yaml"])
    glass = yaml.safe_load(config_map["data"]["break-glass.yaml"])
    assert "extenders" not in glass and normal["extenders"]
    assert glass["leaderElection"] == normal["leaderElection"], "one lease: never two schedulers of one name"
    assert glass["profiles"][0]["schedulerName"] == "gpu-scheduler"
    args = glass["profiles"][0]["pluginConfig"][0]["args"]
    assert args["scoringStrategy"] == normal["profiles"][0]["pluginConfig"][0]["args"]["scoringStrategy"]
    # A share waits without the extender's bind: kube-scheduler counts gpu-milli, which no node has.
    assert "ignoredResources" not in args
    assert glass["apiVersion"] == normal["apiVersion"] and glass["percentageOfNodesToScore"] == 100
    # Changing either configuration rolls the pods.
    changed = [d for d in all_manifests(replace(options, weight=7)) if d["kind"] == "Deployment"]
    base = [d for d in all_manifests(options) if d["kind"] == "Deployment"]
    hashes = {d["spec"]["template"]["metadata"]["annotations"][CONFIG_HASH_ANNOTATION] for d in changed + base}
    assert len(hashes) == 2


def test_a_pod_security_group_comes_with_the_policy_that_keeps_others_out_of_it() -> None:
    """Who may create SecurityGroupPolicies could put any pod in the group the API admits: the manifests
    carry ``gpu-scheduler-security-group`` with the group's policy (tests/e2e/test_identities.py runs it)."""
    docs = all_manifests(SchedulerOptions(extender_url=URL, security_group=SG))
    (guard,) = [
        d for d in _by_kind(docs, "ValidatingAdmissionPolicy") if d["metadata"]["name"].endswith("security-group")
    ]
    assert f"'{SG}' in object.spec.securityGroups.groupIds" in guard["spec"]["matchConditions"][0]["expression"]
    assert guard["spec"]["failurePolicy"] == "Fail"
    (binding,) = [
        d
        for d in _by_kind(docs, "ValidatingAdmissionPolicyBinding")
        if d["metadata"]["name"] == guard["metadata"]["name"]
    ]
    assert binding["spec"]["validationActions"] == ["Deny"]
    without = all_manifests(SchedulerOptions(extender_url=URL, security_group=SG), admission_policy=False)
    assert not _by_kind(without, "ValidatingAdmissionPolicy") and _by_kind(without, "SecurityGroupPolicy")
    assert not [
        d for d in all_manifests(SchedulerOptions(extender_url=URL)) if d["metadata"]["name"].endswith("security-group")
    ]


def test_with_a_node_selector_no_security_group_policy_may_name_the_group() -> None:
    """The scheduler's nodes carry the group: the manifests write no SecurityGroupPolicy, and the guard admits
    none that names it (tests/e2e/test_identities.py runs it)."""
    docs = all_manifests(SchedulerOptions(extender_url=URL, security_group=SG, node_selector={"role": "scheduler"}))
    assert not _by_kind(docs, "SecurityGroupPolicy")
    (guard,) = [
        d for d in _by_kind(docs, "ValidatingAdmissionPolicy") if d["metadata"]["name"].endswith("security-group")
    ]
    (refusal, _) = guard["spec"]["validations"]
    assert refusal["expression"] == "false" and "no SecurityGroupPolicy may name it" in refusal["message"]
