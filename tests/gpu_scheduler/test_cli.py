import json
from unittest.mock import patch

import pytest

from gpu_scheduler.cli import build_parser, main
from scheduler_core.extender.facade import Extender, ExtenderConfig
from scheduler_core.scoring.gpu_fit import ScoreWeights
from scheduler_core.scoring.policy import SHARE_POLICIES
from scheduler_core.state.cluster import ClusterState
from tests.conftest import make_nodes, make_pod


@pytest.fixture
def cluster_file(tmp_path):
    path = tmp_path / "cluster.json"
    nodes = make_nodes("A100", "A100", "T4")
    pods = [make_pod("r", 6, node_name="a100-0", phase="Running")]
    path.write_text(json.dumps({"nodes": nodes, "pods": pods, "utilization": {"a100-1": 0.5}}))
    return path


@pytest.fixture
def pod_file(tmp_path):
    path = tmp_path / "pod.json"
    path.write_text(json.dumps(make_pod("train", 2, models="A100")))
    return path


def test_explain_json_gives_verdict_and_score_components_per_node(cluster_file, pod_file, capsys):
    assert main(["explain", "--pod", str(pod_file), "--cluster", str(cluster_file), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["pod"] == "default/train" and out["gpus"] == 2
    rows = {row["node"]: row for row in out["nodes"]}
    assert [row["node"] for row in out["nodes"]] == ["a100-0", "a100-1", "t4-2"], "best first, failures last"
    assert rows["a100-0"].items() >= {"passed": True, "gpus_free": 2, "fit": 1.0, "score": 10}.items()
    assert rows["a100-1"]["utilization"] == 0.5 and rows["a100-1"]["utilization_score"] == 0.5
    expected = {"passed": False, "unresolvable": True, "reason": "GPU model T4 not in A100", "score": 0}
    assert rows["t4-2"].items() >= expected.items()


def test_explain_table_is_readable(cluster_file, pod_file, capsys):
    assert main(["explain", "--pod", str(pod_file), "--cluster", str(cluster_file)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "pod default/train requests 2 GPU(s); 2 of 3 nodes pass"
    assert out[1].split()[:3] == ["NODE", "ZONE", "MODEL"]
    assert out[-1].startswith("t4-2") and out[-1].endswith("never: GPU model T4 not in A100")


@pytest.mark.parametrize(
    ("pod_text", "message"),
    [
        pytest.param("{", "not valid JSON", id="pod file is not JSON"),
        pytest.param("[]", "expected a v1 Pod object", id="pod file is not an object"),
        pytest.param(json.dumps(make_pod("p", 1, memory="huge")), "gpu.nvidia.com/memory", id="bad annotation"),
    ],
)
def test_explain_bad_input_exits_2_with_a_message(tmp_path, cluster_file, pod_text, message, capsys):
    pod = tmp_path / "pod.json"
    pod.write_text(pod_text)
    assert main(["explain", "--pod", str(pod), "--cluster", str(cluster_file)]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("policy", SHARE_POLICIES)
def test_explain_scores_as_an_extender_configured_with_the_same_flags(tmp_path, policy, capsys):
    """``explain --share-policy P --weight-...`` gives the scores prioritize gives with that configuration."""
    nodes = make_nodes("A100", "A100", "T4", "T4")
    bound = [make_pod("w", 3, node_name="a100-0", phase="Running"), make_pod("s", 0, node_name="t4-2", milli=600)]
    bound[1]["metadata"]["annotations"]["gpu-scheduler.io/assigned-gpus"] = "0:600"
    (tmp_path / "cluster.json").write_text(json.dumps({"nodes": nodes, "pods": bound}))
    state = ClusterState.from_objects(nodes, bound)
    config = ExtenderConfig(share_policy=policy, weights=ScoreWeights(fit=0.9, utilization=0.1))
    for pod in (make_pod("share", 0, milli=300), make_pod("whole", 1), make_pod("cpu", 0)):
        (tmp_path / "pod.json").write_text(json.dumps(pod))
        argv = ["explain", "--pod", str(tmp_path / "pod.json"), "--cluster", str(tmp_path / "cluster.json"), "--json",
                "--share-policy", policy, "--weight-fit", "0.9", "--weight-utilization", "0.1"]  # fmt: skip
        assert main(argv) == 0
        rows = {row["node"]: row["score"] for row in json.loads(capsys.readouterr().out)["nodes"]}
        body = json.dumps({"Pod": pod, "NodeNames": list(state.table.names)}).encode()
        scored = json.loads(Extender(config, cluster=lambda: state).handle("prioritize", body)[1])
        assert rows == {entry["Host"]: entry["Score"] for entry in scored}


def test_explain_refuses_a_share_policy_the_extender_does_not_offer(pod_file, cluster_file, capsys):
    assert main(["explain", "--pod", str(pod_file), "--cluster", str(cluster_file), "--share-policy", "fgd"]) == 2
    assert "--share-policy: share policy 'fgd': expected one of" in capsys.readouterr().err


def test_explain_missing_cluster_file_exits_2(tmp_path, pod_file, capsys):
    assert main(["explain", "--pod", str(pod_file), "--cluster", str(tmp_path / "nope.json")]) == 2
    assert "cannot read cluster file" in capsys.readouterr().err


def test_serve_rejects_invalid_weights_at_start(capsys):
    assert main(["serve", "--port", "0", "--weight-fit", "2"]) == 2
    assert "--weight-fit: must be in [0, 1], got 2.0" in capsys.readouterr().err


@pytest.mark.slow
def test_bench_extender_reports_each_size_and_agreeing_results(capsys):
    argv = ["bench", "extender", "--nodes", "300", "--payload-nodes", "20", "--repeat", "5", "--dra-nodes", "200"]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert (
        report["dra"]["snapshot_nodes"] == 200
        and report["dra"]["filter"]["with_over_without_p50"] > 0
        and "with_dra" in report["dra"]["filter"]["p50_us"]
    )
    assert [c["nodes"] for c in report["core"]] == [300]
    assert [h["nodes"] for h in report["handle_full_nodes"]] == [20]
    core = report["core"][0]
    assert 0 < core["feasible"] < 300
    assert core["speedup_p50"] > 0 and core["filter_score"]["n"] == 5


def _running_pod(name, started="2026-11-29T08:00:00Z", cost=None):
    pod = make_pod(name, 0, namespace="web", node_name=f"node-{name}", phase="Running")
    pod["metadata"]["labels"] = {"app": "api", "gpu-scheduler.io/deletion-cost": "managed"}
    if cost is not None:
        pod["metadata"]["annotations"]["controller.kubernetes.io/pod-deletion-cost"] = cost
    pod["status"].update(
        {"startTime": started, "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": started}]}
    )
    return pod


def test_deletion_costs_dry_run_and_scale_down_victims(tmp_path, capsys):
    pods = [_running_pod(f"api-{i}") for i in range(6)] + [_running_pod("fresh", started="2026-11-29T11:59:30Z")]
    metrics = {
        f"web/api-{i}": {"active_requests": i * 10, "cache_hit_rate": 0.5, "avg_response_time_ms": 200}
        for i in range(5)
    }  # api-5 has no metrics: no new value
    (tmp_path / "pods.json").write_text(json.dumps({"kind": "PodList", "items": pods}))
    (tmp_path / "metrics.json").write_text(json.dumps(metrics))
    argv = [
        "deletion-costs",
        "--pods",
        str(tmp_path / "pods.json"),
        "--metrics",
        str(tmp_path / "metrics.json"),
        "--now",
        "2026-11-29T12:00:00Z",
        "--scale-down",
        "3",
        "--json",
    ]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    # 5 x requests + int(100 x 0.5) + 20 (200 ms is under 500 ms)
    assert out["costs"] == {
        "web/api-0": 70,
        "web/api-1": 120,
        "web/api-2": 170,
        "web/api-3": 220,
        "web/api-4": 270,
        "web/api-5": None,
        "web/fresh": -50,
    }
    # The warming pod (-50), then api-5 (no annotation: 0), then the cheapest refreshed pod.
    assert out["victims"] == ["web/fresh", "web/api-5", "web/api-0"]


def test_deletion_costs_table_and_bad_config(tmp_path, capsys):
    (tmp_path / "pods.json").write_text(json.dumps([_running_pod("a", cost="15")]))
    (tmp_path / "metrics.json").write_text("{}")
    (tmp_path / "cfg.json").write_text(json.dumps({"workloads": [{"policy": "nope"}]}))
    base = ["deletion-costs", "--pods", str(tmp_path / "pods.json"), "--metrics", str(tmp_path / "metrics.json")]
    assert main(base) == 0
    assert capsys.readouterr().out.splitlines()[1].split() == ["web/a", "15", "keep"]
    assert main([*base, "--config", str(tmp_path / "cfg.json")]) == 2
    assert "workloads[0].policy: expected one of metrics" in capsys.readouterr().err


@pytest.mark.slow
def test_bench_deletion_cost_reports_each_size(capsys):
    assert main(["bench", "deletion-cost", "--pods", "50,200", "--repeat", "3"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [r["pods"] for r in report["results"]] == [50, 200]
    assert all(r["metrics"]["n"] == 3 and r["connections"]["p50_us"] > 0 for r in report["results"])


def _write_trace(tmp_path):
    import numpy as np

    from scheduler_core.simulator.traces import synthetic_trace, write_trace

    cluster, tasks = synthetic_trace(30, 200, np.random.default_rng(3))
    write_trace(cluster, tasks, tmp_path / "nodes.csv", tmp_path / "pods.csv")
    return tmp_path / "nodes.csv", tmp_path / "pods.csv"


def test_simulate_writes_json_and_a_plot(tmp_path, capsys):
    nodes, pods = _write_trace(tmp_path)
    argv = ["simulate", "--nodes", str(nodes), "--pods", str(pods), "--policy", "bestfit", "--seeds", "1-3",
            "--json", str(tmp_path / "out.json"), "--plot", str(tmp_path / "out.png")]  # fmt: skip
    assert main(argv) == 0
    report = json.loads((tmp_path / "out.json").read_text())
    assert report["policy"] == "bestfit" and report["seeds"] == [1, 2, 3]
    assert set(report["unallocated_gpu_pct"]) == {"100", "130"}
    assert len(report["unallocated_gpu_pct"]["100"]["per_seed"]) == 3
    assert set(report["frag_ratio_pct"]) == {"80", "90"} and "mean" in report["pods_failed"]
    assert (tmp_path / "out.png").read_bytes().startswith(b"\x89PNG")
    assert "median" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("extra", "message"),
    [(["--policy", "first_fit"], "--policy: expected one of"), (["--seeds", "9-3"], "--seeds: expected a range")],
)
def test_simulate_refuses_bad_arguments(tmp_path, capsys, extra, message):
    nodes, pods = _write_trace(tmp_path)
    assert main(["simulate", "--nodes", str(nodes), "--pods", str(pods), *extra]) != 0
    assert message in capsys.readouterr().err


def test_simulate_offers_every_tie_rule_of_the_simulator_and_defaults_to_the_authors():
    from scheduler_core.simulator.simulate import TIES

    base = ["simulate", "--nodes", "nodes.csv", "--pods", "pods.csv"]
    assert build_parser().parse_args(base).tie == "shuffled"
    assert [build_parser().parse_args([*base, "--tie", tie]).tie for tie in TIES] == list(TIES)
    with pytest.raises(SystemExit):
        build_parser().parse_args([*base, "--tie", "last"])


def test_simulate_refuses_a_trace_without_gpu_tasks_instead_of_hanging(tmp_path, capsys):
    nodes, pods = _write_trace(tmp_path)
    pods.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\np,1000,100,0,0,\n")
    assert main(["simulate", "--nodes", str(nodes), "--pods", str(pods), "--seeds", "1"]) != 0
    assert "no task in the pod list asks for a GPU" in capsys.readouterr().err


def test_simulate_names_the_bad_line_of_a_trace(tmp_path, capsys):
    nodes, pods = _write_trace(tmp_path)
    pods.write_text(pods.read_text() + "bad,1000,100,1,2000,\n")
    assert main(["simulate", "--nodes", str(nodes), "--pods", str(pods), "--seeds", "1"]) != 0
    assert "pods.csv:202: num_gpu=1, gpu_milli=2000" in capsys.readouterr().err


@pytest.mark.slow
def test_bench_policies_reports_cost_per_decision_on_a_synthetic_trace_without_openb(capsys):
    with patch.dict("os.environ", {"OPENB_DIR": "/nonexistent"}):
        assert main(["bench", "policies", "--policies", "bestfit,fgd_cpu", "--seed", "3"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["trace"].startswith("synthetic") and report["seed"] == 3
    assert [r["policy"] for r in report["results"]] == ["bestfit", "fgd_cpu"]
    for r in report["results"]:
        assert r["decisions"] >= 2500  # every task of the trace, and copies up to 1.3x capacity
        assert r["us_per_decision"] == pytest.approx(1e6 * r["seconds"] / r["decisions"], rel=0.05)
        assert 0 <= r["unallocated_gpu_pct_100"] < 100


def test_bench_policies_refuses_an_unknown_policy(capsys):
    assert main(["bench", "policies", "--policies", "fgd,first_fit"]) == 2
    assert "--policies: unknown first_fit" in capsys.readouterr().err


@pytest.mark.slow
def test_bench_share_policy_compares_share_placements_on_a_synthetic_trace(capsys):
    argv = ["bench", "share-policy", "--candidates", "fgd,fgd_cpu_blind,gpu_packing", "--seeds", "1", "--jobs", "1"]
    with patch.dict("os.environ", {"OPENB_DIR": "/nonexistent"}):
        assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["trace"].startswith("synthetic") and report["seeds"] == [42] and report["others_by"] == "fgd_cpu"
    assert set(report["unallocated_gpu_pct_100"]) == {"fgd", "fgd_cpu_blind", "gpu_packing"}
    assert all(0 <= v < 100 for v in report["unallocated_gpu_pct_100"].values())
    assert main(["bench", "share-policy", "--candidates", "fgd,first_fit"]) == 2
    assert "--candidates: unknown first_fit" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["demo", "--placement-seeds", "x"], "--placement-seeds: expected a range"),
        (["bench", "share-policy", "--seeds", "0"], "--seeds: expected at least 1, got 0"),
        (["bench", "policies", "--trace", "nope"], "--trace: 'nope' is not in"),
        (["bench", "share-policy", "--trace", "nope", "--seeds", "1"], "--trace: 'nope' is not in"),
    ],
)
def test_bench_and_demo_refuse_bad_arguments_naming_them(tmp_path, capsys, argv, message):
    """A trace name the openb directory lacks is refused with the names it has, not replaced by the
    synthetic trace (that stands in only when the directory is absent)."""
    (tmp_path / "openb_pod_list_default.csv").write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\n")
    with patch.dict("os.environ", {"OPENB_DIR": str(tmp_path)}):
        assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err
    if "--trace" in message:
        assert "choose from default" in err


@pytest.fixture
def served(monkeypatch):
    """``serve``'s HTTP server replaced by a recorder: the command runs up to the point of serving."""
    import gpu_scheduler.server

    calls = []
    monkeypatch.setattr(gpu_scheduler.server, "serve", lambda svc, host, port, **_: calls.append((host, svc.extender)))
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")  # the ledger's client is made, never called
    return calls


SHARING = ["--ledger-table", "gpu-ledger", "--kube-url", "http://127.0.0.1:1", "--kube-token", "t", "--port", "0"]


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.0.3.7", "gpu-scheduler.internal"])
def test_serve_refuses_bind_on_a_reachable_host_without_insecure(served, capsys, host):
    assert main(["serve", "--host", host, *SHARING]) == 2
    err = capsys.readouterr().err
    assert f"--host {host} with --ledger-table" in err
    assert "no TLS and no authentication" in err and "anyone who reaches the port could ask it to bind pods" in err
    assert "--insecure" in err
    assert served == [], "it must not serve"


def test_serve_binds_on_a_reachable_host_with_insecure_and_warns(served, caplog):
    assert main(["serve", "--host", "0.0.0.0", "--insecure", *SHARING]) == 0
    ((host, extender),) = served
    assert host == "0.0.0.0" and "bind" in extender.verbs
    (warning,) = [r for r in caplog.records if r.levelname == "WARNING" and "--insecure" in r.getMessage()]
    assert "without TLS or authentication" in warning.getMessage()
    assert "anyone who reaches the port can ask it to bind pods" in warning.getMessage()


@pytest.mark.parametrize(
    ("argv", "verbs"),
    [
        pytest.param(["--host", "127.0.0.1", *SHARING], ("bind",), id="loopback with a ledger"),
        pytest.param(["--host", "::1", *SHARING], ("bind",), id="IPv6 loopback with a ledger"),
        pytest.param(["--host", "0.0.0.0", "--port", "0"], (), id="a reachable host without a ledger serves no bind"),
    ],
)
def test_serve_needs_no_insecure_where_nobody_else_can_bind(served, caplog, argv, verbs):
    assert main(["serve", *argv]) == 0
    ((_, extender),) = served
    assert all(verb in extender.verbs for verb in verbs) and ("bind" in extender.verbs) == bool(verbs)
    assert not [r for r in caplog.records if "--insecure" in r.getMessage()]


@pytest.fixture
def no_settings_env(monkeypatch):
    for name in ("SNAPSHOT_URI", "CLUSTER_NAME", "KUBE_API_URL", "KUBE_TOKEN", "KUBECONFIG", "MAX_SNAPSHOT_AGE_S"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_serve_takes_the_extender_settings_from_their_one_declaration(no_settings_env):
    from application.extender.settings import ExtenderSettings
    from gpu_scheduler.cli import build_parser
    from gpu_scheduler.commands import serve
    from scheduler_core.extender.facade import DEFAULT_MAX_BODY_BYTES

    def settings(*argv):
        return serve.settings(build_parser().parse_args(["serve", *argv]))

    # The Lambda's defaults, but the body limit: no 6 MB invocation limit on a plain HTTP server.
    assert settings() == ExtenderSettings(max_body_bytes=DEFAULT_MAX_BODY_BYTES)
    zones = '{"a": {"b": 0.1}}'
    flags = ["--max-snapshot-age-s", "60", "--share-policy", "bestfit", "--zone-alpha", "0.2",
             "--locality-zone-values", zones, "--refresh-s", "0", "--max-body-bytes", "9"]  # fmt: skip
    assert settings(*flags) == ExtenderSettings(
        max_snapshot_age_s=60.0,
        share_policy="bestfit",
        locality_zone_alpha=0.2,
        locality_zone_values=zones,
        snapshot_refresh_s=0.0,
        max_body_bytes=9,
    )
    # Where serve read a variable before, it still does; the others are the sidecar's flags only.
    no_settings_env.setenv("SNAPSHOT_URI", "/state/snapshot.npz")
    no_settings_env.setenv("MAX_SNAPSHOT_AGE_S", "5")
    from_env = settings()
    assert (from_env.snapshot_uri, from_env.max_snapshot_age_s) == ("/state/snapshot.npz", 180.0)
    assert settings("--snapshot", "s3://b/k").snapshot_uri == "s3://b/k"


def test_serve_names_a_bad_setting_by_its_flag(no_settings_env, capsys):
    assert main(["serve", "--port", "0", "--share-policy", "fgd", "--max-snapshot-age-s", "-1"]) == 2
    err = capsys.readouterr().err
    assert "--max-snapshot-age-s: must be a non-negative number of seconds, got -1.0" in err
    assert "--share-policy: share policy 'fgd': expected one of fgd_cpu" in err


def test_autoscaler_affinity_prints_the_pod_with_both_terms_and_refuses_what_no_instance_type_meets(tmp_path, capsys):
    import yaml

    pod = tmp_path / "pod.yaml"
    pod.write_text(yaml.safe_dump(make_pod("train", 8, models="A100", memory="80Gi")))
    assert main(["autoscaler-affinity", str(pod)]) == 0
    written = yaml.safe_load(capsys.readouterr().out)
    terms = written["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"] == [
        {"matchExpressions": [
            {"key": "karpenter.k8s.aws/instance-gpu-name", "operator": "In", "values": ["a100"]},
            {"key": "karpenter.k8s.aws/instance-gpu-memory", "operator": "Gt", "values": ["40960"]}]},
        {"matchExpressions": [
            {"key": "gpu.nvidia.com/model", "operator": "In", "values": ["A100"]},
            {"key": "gpu.nvidia.com/memory", "operator": "Gt", "values": ["81919"]}]},
    ]  # fmt: skip
    assert written["metadata"] == make_pod("train", 8, models="A100", memory="80Gi")["metadata"]
    # Written once, it is left as it is; an H100 with 80Gi (its GPUs report 81559 MiB) is refused.
    again = tmp_path / "again.yaml"
    again.write_text(yaml.safe_dump(written))
    assert main(["autoscaler-affinity", str(again), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == written
    pod.write_text(yaml.safe_dump(make_pod("train", 1, models="H100", memory="80Gi")))
    assert main(["autoscaler-affinity", str(pod)]) == 2
    assert "p5.48xlarge: 81559" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "message"),
    [("[1, 2", "not valid JSON"), ("kind: [Node\n", "not JSON, nor YAML"), ("kind: Node\n", "expected a v1 Pod"),
     ('{"metadata": {"annotations": {"gpu.nvidia.com/model": "A100!"}}}', "is not a GPU model name")],
)  # fmt: skip
def test_autoscaler_affinity_bad_input_exits_2_naming_it(tmp_path, text, message, capsys):
    pod = tmp_path / "pod.yaml"
    pod.write_text(text)
    assert main(["autoscaler-affinity", str(pod)]) == 2
    assert message in capsys.readouterr().err
    assert main(["autoscaler-affinity", str(tmp_path / "absent.yaml")]) == 2
