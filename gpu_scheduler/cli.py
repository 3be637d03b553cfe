"""``gpu-scheduler``: serve, explain, demo, simulate, scheduler-config and bench.

Exit codes: 0 success, 1 a runtime failure, 2 bad arguments or bad input files (the message says
which file and field).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from scheduler_core.errors import ConfigError, InvalidArgsError, InvalidPodError
from scheduler_core.explain import NodeExplanation, explain
from scheduler_core.extender import DEFAULT_MAX_BODY_BYTES, ClusterSource, Extender, ExtenderConfig, decode_json
from scheduler_core.gpu_fit import ScoreWeights
from scheduler_core.ledger_readings import LedgerReadings
from scheduler_core.locality import DEFAULT_LABEL_KEYS, LocalitySettings
from scheduler_core.pods import pod_demand
from scheduler_core.share_scoring import DEFAULT_SHARE_POLICY

log = logging.getLogger("gpu_scheduler")


class UsageError(Exception):
    """Bad arguments or input files: exit code 2."""


def _int_list(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected a comma list of integers, got {text!r}") from exc
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _add_weights(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--weight-fit", type=float, default=ScoreWeights.fit, help="best-fit weight (default 0.7)")
    parser.add_argument(
        "--weight-utilization",
        type=float,
        default=ScoreWeights.utilization,
        help="low-utilisation weight (default 0.3)",
    )
    parser.add_argument(
        "--weight-locality", type=float, default=ScoreWeights.locality, help="network-locality weight (default 0.5)"
    )
    parser.add_argument(
        "--locality-label-keys",
        default=",".join(DEFAULT_LABEL_KEYS),
        help="label keys peers may select on (default app,app.kubernetes.io/name)",
    )
    parser.add_argument("--zone-alpha", type=float, default=LocalitySettings.zone_alpha, help="same-zone value (0.5)")
    parser.add_argument(
        "--locality-self-weight",
        type=float,
        default=LocalitySettings.self_weight,
        help="weight of a pod's own workload among its peers (1.0; 0 turns it off)",
    )


def _weights(args: argparse.Namespace) -> ScoreWeights:
    return ScoreWeights(fit=args.weight_fit, utilization=args.weight_utilization, locality=args.weight_locality)


def _locality(args: argparse.Namespace) -> LocalitySettings:
    keys = tuple(key.strip() for key in args.locality_label_keys.split(",") if key.strip())
    return LocalitySettings(label_keys=keys, zone_alpha=args.zone_alpha, self_weight=args.locality_self_weight)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpu-scheduler", description="GPU-aware kube-scheduler extender for EKS")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the extender as a local HTTP server")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8888, help="0 picks a free port (printed on stdout)")
    state = serve.add_mutually_exclusive_group()
    state.add_argument("--cluster", type=Path, help='JSON {"nodes": [v1 Node], "pods": [v1 Pod]} for GPU usage')
    state.add_argument(
        "--snapshot",
        default=os.environ.get("SNAPSHOT_URI") or None,
        help="cluster snapshot: s3://bucket/key, file:///path or a path (default: $SNAPSHOT_URI)",
    )
    serve.add_argument("--refresh-s", type=float, default=None, help="re-check the state this often (1 s; 10 s for S3)")
    serve.add_argument("--max-snapshot-age-s", type=float, default=180.0, help="refuse an older snapshot")
    serve.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES)
    serve.add_argument(
        "--share-policy", default=DEFAULT_SHARE_POLICY, help="fgd_cpu (default), gpu_packing, bestfit or dotprod"
    )
    sharing = serve.add_argument_group("GPU sharing: with --ledger-table, bind and preempt are served")
    sharing.add_argument(
        "--ledger-table", default="", help="the GPU ledger's DynamoDB table (boto3 honours AWS_ENDPOINT_URL_DYNAMODB)"
    )
    sharing.add_argument(
        "--cluster-name", default=os.environ.get("CLUSTER_NAME", ""), help="the EKS cluster bind writes to"
    )
    sharing.add_argument("--kube-url", default=os.environ.get("KUBE_API_URL", ""), help="or an API URL ($KUBE_API_URL)")
    sharing.add_argument(
        "--kube-token", default=os.environ.get("KUBE_TOKEN", ""), help="and its bearer token ($KUBE_TOKEN)"
    )
    sharing.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG", ""), help="or a kubeconfig ($KUBECONFIG)")
    _add_weights(serve)

    exp = commands.add_parser("explain", help="show per node why a pod passes or fails, and how it scores")
    exp.add_argument("--pod", type=Path, required=True, help="v1 Pod JSON")
    exp.add_argument("--cluster", type=Path, required=True, help='JSON {"nodes": [...], "pods": [...]}')
    exp.add_argument("--json", action="store_true", help="machine-readable output")
    _add_weights(exp)

    demo = commands.add_parser("demo", help="drive a synthetic GPU cluster through a local extender")
    demo.add_argument("--nodes", type=int, default=200)
    demo.add_argument("--pods", type=int, default=350)
    demo.add_argument("--seed", type=int, default=7)
    demo.add_argument(
        "--mode", choices=("names", "nodes"), default="names", help="nodeCacheCapable true (names) or false (nodes)"
    )
    demo.add_argument("--json", action="store_true", help="print the summary as JSON")
    demo.add_argument("--placement-seeds", default="42,43", help="seeds for the FGD vs ours comparison ('' skips it)")

    gsim = commands.add_parser("simulate", help="GPU-sharing placement on a trace, by the FGD paper's protocol")
    gsim.add_argument("--nodes", type=Path, required=True, help="node list CSV (openb format)")
    gsim.add_argument("--pods", type=Path, required=True, help="pod list CSV (openb format)")
    gsim.add_argument(
        "--policy",
        default="fgd_cpu",
        help="fgd_cpu (ours, the default), fgd, bestfit, gpu_packing, gpu_clustering, dotprod or random",
    )
    gsim.add_argument("--seeds", default="42-51", help="a range (42-51) or a list (42,43)")
    gsim.add_argument("--tune", type=float, default=1.3, help="inflate the trace to this multiple of GPU capacity")
    gsim.add_argument(
        "--tie", choices=("shuffled", "first", "random"), default="shuffled",
        help="how equal top scores are broken: the first node in an order shuffled once per seed (as the authors' "
        "simulator does), the first node in the file, or at random per decision",
    )  # fmt: skip
    gsim.add_argument("--jobs", type=int, default=1, help="seeds run in parallel")
    gsim.add_argument("--json", type=Path, help="write the results here")
    gsim.add_argument("--plot", type=Path, help="draw unallocated GPU %% against arrived %% to this PNG")

    sim = commands.add_parser("simulate-locality", help="cross-zone traffic on a synthetic microservice graph")
    sim.add_argument("--services", type=int, default=30)
    sim.add_argument("--zones", type=int, default=3)
    sim.add_argument("--seed", type=int, default=1)
    sim.add_argument("--runs", type=int, default=10, help="graphs to average over (seeds seed, seed+1, ...)")
    sim.add_argument("--extender-weight", type=float, default=2.0, help="the extender's weight in kube-scheduler")
    sim.add_argument("--json", action="store_true", help="print the full report as JSON")

    costs = commands.add_parser("deletion-costs", help="dry run: pod deletion costs from a metrics file")
    costs.add_argument("--pods", type=Path, required=True, help="v1 PodList or a JSON list of v1 Pods")
    costs.add_argument("--metrics", type=Path, required=True, help='{"namespace/pod": {"active_requests": 3, ...}}')
    costs.add_argument("--config", type=Path, help="workload config JSON (default: the metrics policy for every pod)")
    costs.add_argument("--scale-down", type=int, default=0, help="also list the first N pods a scale-down removes")
    costs.add_argument("--now", help="ISO 8601 time to judge pod age by (default: now)")
    costs.add_argument("--json", action="store_true")

    cfg = commands.add_parser(
        "scheduler-config", help="the second kube-scheduler's manifests (RBAC, configuration, Deployment)"
    )
    cfg.add_argument("--url", required=True, help="the extender's base URL, stage included (https://...)")
    cfg.add_argument("--sharing", action="store_true", help="fractional GPUs: add the bind and preempt verbs")
    cfg.add_argument("--weight", type=int, default=5, help="the extender's weight in kube-scheduler (default 5)")
    cfg.add_argument("--image", help="kube-scheduler image; match the cluster's minor version")
    cfg.add_argument("--namespace", default="kube-system")
    cfg.add_argument("--out", type=Path, help="write here (default: stdout)")

    bench = commands.add_parser("bench", help="benchmarks (JSON on stdout)")
    suites = bench.add_subparsers(dest="suite", required=True)
    ext = suites.add_parser("extender", help="core filter+score and the full handle() path")
    ext.add_argument("--nodes", type=_int_list, default=[1000, 10000, 100000], help="core table sizes")
    ext.add_argument("--payload-nodes", type=_int_list, default=[100, 500, 1000], help="full Node payload sizes")
    ext.add_argument("--repeat", type=int, default=200, help="timed iterations per size")
    ext.add_argument("--seed", type=int, default=1)
    ext.add_argument("--snapshot-nodes", type=int, default=0, help="time the Lambda path over a snapshot this big")
    ext.add_argument("--names", type=_int_list, default=[1000, 10000, 100000], help="NodeNames per request")
    ext.add_argument(
        "--share-names", type=_int_list, default=[1000, 10000], help="names per share prioritize, by share policy"
    )
    ext.add_argument("--json", action="store_true", help="JSON output (the default; kept for scripts)")
    dc = suites.add_parser("deletion-cost", help="deletion-cost computation for many pods at once")
    dc.add_argument("--pods", type=_int_list, default=[1000, 10000, 100000])
    dc.add_argument("--repeat", type=int, default=100)
    dc.add_argument("--seed", type=int, default=1)
    dc.add_argument("--json", action="store_true", help="JSON output (the default; kept for scripts)")
    dcr = suites.add_parser("deletion-cost-run", help="one deletion-cost refresher run against the API double")
    dcr.add_argument("--pods", type=int, default=10_000)
    dcr.add_argument("--seed", type=int, default=0)
    dcr.add_argument("--json", action="store_true", help="JSON output (the only format)")
    ns = suites.add_parser("node-state", help="one node-state refresher run against a synthetic cluster")
    ns.add_argument("--nodes", type=int, default=10_000)
    ns.add_argument("--pods", type=int, default=200_000)
    ns.add_argument("--seed", type=int, default=0)
    ns.add_argument("--concurrency", type=int, default=8, help="label patches in flight")
    ns.add_argument("--json", action="store_true", help="JSON output (the only format)")
    led = suites.add_parser("ledger", help="GPU-ledger binds under contention against moto's DynamoDB server")
    led.add_argument("--threads", type=int, default=8)
    led.add_argument("--pods", type=int, default=2000)
    led.add_argument("--json", action="store_true", help="JSON output (the only format)")
    bnd = suites.add_parser("bind", help="the whole bind verb: ledger in moto's server, annotation and Binding")
    bnd.add_argument("--threads", type=int, default=8)
    bnd.add_argument("--pods", type=int, default=1000)
    bnd.add_argument("--json", action="store_true", help="JSON output (the only format)")
    pol = suites.add_parser("policies", help="placement policies: seconds per seed and cost per decision")
    pol.add_argument(
        "--policies", default="random,dotprod,gpu_clustering,gpu_packing,bestfit,fgd,fgd_cpu", help="comma list"
    )
    pol.add_argument("--trace", default="default", help="openb trace name (synthetic when ../shared lacks it)")
    pol.add_argument("--seed", type=int, default=42)
    pol.add_argument("--json", action="store_true", help="JSON output (the only format)")
    shp = suites.add_parser("share-policy", help="which policy the extender should place GPU shares with")
    shp.add_argument(
        "--candidates", default="fgd,extender,fgd_cpu_blind,gpu_packing,bestfit,dotprod", help="comma list of policies"
    )
    shp.add_argument("--trace", default="default", help="openb trace name (synthetic when ../shared lacks it)")
    shp.add_argument("--seeds", type=int, default=10, help="seeds 42, 43, ...")
    shp.add_argument("--jobs", type=int, default=2)
    shp.add_argument("--json", action="store_true", help="JSON output (the only format)")
    syn = suites.add_parser("synth", help="make synth: wall time and peak memory of the CDK app")
    syn.add_argument("--runs", type=int, default=3)
    syn.add_argument("--package-dir", type=Path, default=Path("build/lambda"), help="where make package wrote")
    syn.add_argument("--json", action="store_true", help="JSON output (the only format)")
    cold = suites.add_parser("cold-start", help="fresh interpreter: import + init + first request (S3 via moto)")
    cold.add_argument("--runs", type=int, default=5)
    cold.add_argument("--snapshot-nodes", type=int, default=10000)
    cold.add_argument("--seed", type=int, default=1)
    cold.add_argument("--json", action="store_true", help="JSON output (the default; kept for scripts)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        if args.command == "serve":
            return _serve(args)
        if args.command == "explain":
            return _explain(args)
        if args.command == "demo":
            from gpu_scheduler.demo import run_demo
            from gpu_scheduler.simulate_cmd import parse_seeds

            return run_demo(
                n_nodes=args.nodes,
                n_pods=args.pods,
                seed=args.seed,
                mode=args.mode,
                as_json=args.json,
                placement_seeds=tuple(parse_seeds(args.placement_seeds, "--placement-seeds")),
            )
        if args.command == "deletion-costs":
            return _deletion_costs(args)
        if args.command == "simulate":
            return _simulate(args)
        if args.command == "simulate-locality":
            return _simulate_locality(args)
        if args.command == "scheduler-config":
            return _scheduler_config(args)
        if args.command == "bench" and args.suite == "deletion-cost":
            from bench.deletion_cost import run as run_cost_bench

            print(json.dumps(run_cost_bench(args.pods, args.repeat, args.seed), indent=2))
            return 0
        if args.command == "bench" and args.suite == "deletion-cost-run":
            from bench.deletion_cost_run import run as run_cost_refresher_bench

            print(json.dumps(run_cost_refresher_bench(args.pods, args.seed), indent=2))
            return 0
        if args.command == "bench" and args.suite == "node-state":
            from bench.node_state import run as run_node_state_bench

            print(json.dumps(run_node_state_bench(args.nodes, args.pods, args.seed, args.concurrency), indent=2))
            return 0
        if args.command == "bench" and args.suite == "ledger":
            from bench.ledger import run as run_ledger_bench

            print(json.dumps(run_ledger_bench(args.threads, args.pods), indent=2))
            return 0
        if args.command == "bench" and args.suite == "bind":
            from bench.bind import run as run_bind_bench

            print(json.dumps(run_bind_bench(args.threads, args.pods), indent=2))
            return 0
        if args.command == "bench" and args.suite == "policies":
            from bench.policies import run as run_policies_bench

            names = [p.strip() for p in args.policies.split(",") if p.strip()]
            try:
                report = run_policies_bench(names, args.trace, args.seed)
            except ValueError as exc:
                raise InvalidArgsError(str(exc)) from exc
            print(json.dumps(report, indent=2))
            return 0
        if args.command == "bench" and args.suite == "share-policy":
            from bench.share_policy import run as run_share_policy_bench

            names = [p.strip() for p in args.candidates.split(",") if p.strip()]
            try:
                report = run_share_policy_bench(names, args.trace, args.seeds, args.jobs)
            except ValueError as exc:
                raise InvalidArgsError(str(exc)) from exc
            print(json.dumps(report, indent=2))
            return 0
        if args.command == "bench" and args.suite == "synth":
            from bench.synth import run as run_synth_bench

            print(json.dumps(run_synth_bench(args.runs, args.package_dir.resolve()), indent=2))
            return 0
        if args.command == "bench" and args.suite == "cold-start":
            from bench.lambda_path import cold_start

            print(json.dumps(cold_start(args.runs, args.snapshot_nodes, args.seed), indent=2))
            return 0
        if args.command == "bench":
            from bench.extender import run as run_extender_bench

            print(json.dumps(run_extender_bench(args), indent=2))
            return 0
    except (UsageError, ConfigError, InvalidArgsError, InvalidPodError) as exc:
        print(f"gpu-scheduler {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    raise AssertionError(f"unhandled command {args.command!r}")


def _scheduler_config(args: argparse.Namespace) -> int:
    from gpu_scheduler.scheduler_manifests import DEFAULT_IMAGE, SchedulerOptions, all_manifests, render_yaml

    options = SchedulerOptions(
        extender_url=args.url,
        sharing=args.sharing,
        weight=args.weight,
        image=args.image or DEFAULT_IMAGE,
        namespace=args.namespace,
    ).validated()
    text = render_yaml(all_manifests(options), header="Generated by `gpu-scheduler scheduler-config`.")
    if args.out is None:
        sys.stdout.write(text)
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


def _serve(args: argparse.Namespace) -> int:
    from gpu_scheduler.server import ClusterFile, print_ready, serve

    config = ExtenderConfig(
        weights=_weights(args),
        max_body_bytes=args.max_body_bytes,
        locality=_locality(args),
        share_policy=args.share_policy,
    ).validated()
    cluster: ClusterSource | None = None
    if args.cluster:
        cluster = ClusterFile(args.cluster, refresh_s=1.0 if args.refresh_s is None else args.refresh_s)
    elif args.snapshot:
        from adapters.snapshot_store import DEFAULT_REFRESH_S, SnapshotSource, open_store

        try:
            store = open_store(args.snapshot)
        except ValueError as exc:
            raise UsageError(str(exc)) from exc
        refresh_s = DEFAULT_REFRESH_S if args.refresh_s is None else args.refresh_s
        cluster = SnapshotSource(store, refresh_s=refresh_s, max_age_s=args.max_snapshot_age_s)
    readings = LedgerReadings()
    accounting = None
    if args.ledger_table:
        from adapters.binder import ledger_binder
        from adapters.settings import ClusterAccess

        access = ClusterAccess(args.cluster_name, args.kube_url, args.kube_token, args.kubeconfig)
        if access.access_problems():
            raise UsageError("--ledger-table needs --cluster-name, --kube-url or --kubeconfig: bind writes to the API")
        accounting = ledger_binder(args.ledger_table, access, cluster=cluster, readings=readings)
    serve(Extender(config, cluster, readings, accounting), args.host, args.port, ready=print_ready)
    return 0


def _deletion_costs(args: argparse.Namespace) -> int:
    from datetime import UTC, datetime

    from scheduler_core.deletion_cost import CostConfig
    from scheduler_core.deletion_plan import costs_for, current_cost, pod_key, pod_list, victims

    if args.scale_down < 0:
        raise UsageError(f"--scale-down must not be negative, got {args.scale_down}")
    try:
        now = (
            datetime.fromisoformat(args.now.replace("Z", "+00:00")).timestamp()
            if args.now
            else datetime.now(UTC).timestamp()
        )
    except ValueError as exc:
        raise UsageError(f"--now: expected an ISO 8601 time, got {args.now!r}") from exc
    pods = pod_list(_read_json(args.pods, "pods file"))
    config = CostConfig.from_json(_read_json(args.config, "config file")) if args.config else CostConfig()
    costs = costs_for(pods, _read_json(args.metrics, "metrics file"), config, now)
    order = victims(pods, costs, args.scale_down, now) if args.scale_down else []
    if args.json:
        print(json.dumps({"costs": costs, "victims": order}, indent=2))
        return 0
    width = max((len(k) for k in costs), default=3)
    print(f"{'POD':<{width}}  {'CURRENT':>8}  {'NEW':>6}")
    for pod in pods:
        key, new = pod_key(pod), costs[pod_key(pod)]
        old = current_cost(pod)
        print(f"{key:<{width}}  {'-' if old is None else old:>8}  {'keep' if new is None else new:>6}")
    if order:
        print(f"a scale-down by {args.scale_down} removes: {', '.join(order)}")
    return 0


def _simulate(args: argparse.Namespace) -> int:
    from gpu_scheduler.simulate_cmd import parse_seeds, plot, run, write_json
    from scheduler_core.policies import registry

    if args.policy not in registry():
        raise UsageError(f"--policy: expected one of {', '.join(sorted(registry()))}, got {args.policy!r}")
    result = run(args.nodes, args.pods, args.policy, parse_seeds(args.seeds), args.tune, args.tie, args.jobs)
    if args.json:
        write_json(result, args.json)
    if args.plot:
        plot(result, args.plot)
    unalloc = result["unallocated_gpu_pct"]
    print(f"{args.policy} on {args.pods.name}, seeds {args.seeds}, tune {args.tune}, ties {args.tie}")
    print(f"{'seed':>6} {'unalloc@100':>12} {'unalloc@130':>12} {'frag@80':>8} {'frag@90':>8} {'failed':>7}")
    frag = result["frag_ratio_pct"]
    for i, seed in enumerate(result["seeds"]):
        print(
            f"{seed:>6} {unalloc['100']['per_seed'][i]:>12.2f} {unalloc['130']['per_seed'][i]:>12.2f} "
            f"{frag['80']['per_seed'][i]:>8.2f} {frag['90']['per_seed'][i]:>8.2f} "
            f"{result['pods_failed']['per_seed'][i]:>7.0f}"
        )
    print(f"{'mean':>6} {unalloc['100']['mean']:>12.2f} {unalloc['130']['mean']:>12.2f}")
    print(f"{'median':>6} {unalloc['100']['median']:>12.2f} {unalloc['130']['median']:>12.2f}")
    return 0


def _simulate_locality(args: argparse.Namespace) -> int:
    from scheduler_core.locality_sim import simulate_locality

    if args.services < 2 or args.zones < 1 or args.runs < 1:
        raise UsageError("--services must be at least 2, --zones and --runs at least 1")
    report = simulate_locality(args.services, args.zones, args.seed, args.runs, args.extender_weight)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(
        f"{report['services']} services on {report['nodes']} nodes in {report['zones']} zones, {report['runs']} graphs"
    )
    print(f"{'policy':<8} {'cross-zone traffic':>19} {'zone imbalance':>15} {'single-zone services':>21}")
    for policy, figures in report["mean"].items():
        print(
            f"{policy:<8} {figures['cross_zone_fraction']:>18.1%} {figures['zone_imbalance']:>15.2f} "
            f"{figures['single_zone_services']:>21.1f}"
        )
    print(f"cross-zone traffic saved against default spreading: {report['cross_zone_reduction_vs_spread']:.1%}")
    return 0


def _read_json(path: Path, what: str) -> Any:
    try:
        return decode_json(path.read_bytes())
    except OSError as exc:
        raise UsageError(f"cannot read {what} {path}: {exc.strerror}") from exc
    except InvalidArgsError as exc:
        raise UsageError(f"{what} {path}: {exc}") from exc


def _explain(args: argparse.Namespace) -> int:
    from gpu_scheduler.server import load_cluster_file

    pod = _read_json(args.pod, "pod file")
    if not isinstance(pod, dict):
        raise UsageError(f"pod file {args.pod}: expected a v1 Pod object")
    demand = pod_demand(pod)
    state = load_cluster_file(args.cluster)
    config = ExtenderConfig(weights=_weights(args), locality=_locality(args)).validated()
    rows = explain(state, demand, config.weights, config.locality)
    if args.json:
        print(json.dumps({"pod": demand.key, "gpus": demand.gpus, "nodes": [r.to_json() for r in rows]}, indent=2))
    else:
        print(_explain_table(demand.key, demand.gpus, rows))
    return 0


def _explain_table(pod: str, gpus: int, rows: list[NodeExplanation]) -> str:
    header = ("NODE", "ZONE", "MODEL", "MEM MiB", "FREE/ALLOC", "UTIL", "FIT", "UTIL.S", "LOCAL", "SCORE", "VERDICT")
    lines = [header]
    for r in rows:
        verdict = "ok" if r.passed else ("never: " if r.unresolvable else "not now: ") + r.reason
        lines.append(
            (
                r.node,
                r.zone or "-",
                r.model or "-",
                str(r.memory_mib or "-"),
                f"{r.gpus_free}/{r.gpus_allocatable}",
                f"{r.utilization:.2f}",
                f"{r.fit:.2f}",
                f"{r.utilization_score:.2f}",
                f"{r.locality:.2f}",
                str(r.score),
                verdict,
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header) - 1)]
    text = [f"pod {pod} requests {gpus} GPU(s); {sum(r.passed for r in rows)} of {len(rows)} nodes pass"]
    text += [
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=False)) + "  " + line[-1] for line in lines
    ]
    return "\n".join(text)


if __name__ == "__main__":
    sys.exit(main())
