"""``gpu-scheduler bench SUITE ...``: every benchmark suite, one dispatch table; each prints JSON on stdout.

Speed and memory are measured here, never in timed tests. Ratios are measured side by side in one run.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

Number = TypeVar("Number", int, float)


def int_list(text: str) -> list[int]:
    """``1000,10000``: positive integers (an argparse ``type``)."""
    return _numbers(text, int, lambda v: v > 0, "positive integers")


def count_list(text: str) -> list[int]:
    """``0,1,2,4``: whole numbers of at least 0 (an argparse ``type``)."""
    return _numbers(text, int, lambda v: v >= 0, "whole numbers of at least 0")


def fraction_list(text: str) -> list[float]:
    """``0.95,0.97``: numbers above 0 (an argparse ``type``; ``nan`` is not)."""
    return _numbers(text, float, lambda v: v > 0, "numbers above 0")


def _numbers(text: str, kind: Callable[[str], Number], ok: Callable[[Number], bool], what: str) -> list[Number]:
    """A comma list of ``kind``, each ``ok``: :class:`argparse.ArgumentTypeError` saying ``what`` otherwise."""
    try:
        values = [kind(part) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected a comma list of {what}, got {text!r}") from exc
    if not values or not all(ok(v) for v in values):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return values


def _moves(args: argparse.Namespace) -> dict[str, Any]:
    from bench.moves import run_moves

    return run_moves(args.traces, args.seeds, args.K, args.jobs)


def _churn(args: argparse.Namespace) -> dict[str, Any]:
    from bench.moves import run_churn

    return run_churn(args.trace, args.seeds, args.loads, args.K, args.jobs)


def _consolidation(args: argparse.Namespace) -> dict[str, Any]:
    from bench.consolidation import run

    return run(args.nodes, args.filter_nodes, args.pending, args.moves, args.repeat, args.seed)


def _extender(args: argparse.Namespace) -> dict[str, Any]:
    from bench.extender import run

    return run(args)


def _path(args: argparse.Namespace) -> dict[str, Any]:
    from bench.path import run

    return run()


def _deletion_cost(args: argparse.Namespace) -> dict[str, Any]:
    from bench.deletion_cost import run

    return run(args.pods, args.repeat, args.seed)


def _deletion_cost_run(args: argparse.Namespace) -> dict[str, Any]:
    from bench.deletion_cost_run import run

    return run(args.pods, args.seed)


def _node_state(args: argparse.Namespace) -> dict[str, Any]:
    from bench.node_state import run

    return run(args.nodes, args.pods, args.seed, args.concurrency)


def _node_caps(args: argparse.Namespace) -> dict[str, Any]:
    from bench.node_caps import run

    return run(args.nodes, args.pods_per_node, args.repeat, args.seed, args.liar_gpus)


def _ledger(args: argparse.Namespace) -> dict[str, Any]:
    from bench.ledger import run

    return run(args.threads, args.pods)


def _bind(args: argparse.Namespace) -> dict[str, Any]:
    from bench.bind import run

    return run(args.threads, args.pods)


def _policies(args: argparse.Namespace) -> dict[str, Any]:
    from bench.policies import run

    return run(_names(args.policies), args.trace, args.seed)


def _share_policy(args: argparse.Namespace) -> dict[str, Any]:
    from bench.share_policy import CANDIDATES, run

    return run(_names(args.candidates) if args.candidates else list(CANDIDATES), args.trace, args.seeds, args.jobs)


def _kube_scores(args: argparse.Namespace) -> dict[str, Any]:
    from bench.kube_scores import run

    return run(_names(args.traces) or None, args.seeds, args.weight, tuple(_names(args.plugins)), args.jobs)


def _synth(args: argparse.Namespace) -> dict[str, Any]:
    from bench.synth import run

    return run(args.runs, args.package_dir.resolve())


def _snapstart(args: argparse.Namespace) -> dict[str, Any]:
    from bench.lambda_path import restore_stand_in

    return restore_stand_in(args.runs, args.snapshot_nodes, args.seed)


def _cold_start(args: argparse.Namespace) -> dict[str, Any]:
    from bench.lambda_path import cold_start

    return cold_start(args.runs, args.snapshot_nodes, args.seed)


def _e2e(args: argparse.Namespace) -> dict[str, Any]:
    from bench.e2e import run

    return run(
        nodes=args.nodes, pods=args.pods, runs=args.runs, share_nodes=args.share_nodes, share_pods=args.share_pods,
        qps=args.qps, refresh=args.refresh, seed=args.seed, state=args.state, weight=args.weight, part=args.part,
    )  # fmt: skip


def _e2e_weights(args: argparse.Namespace) -> dict[str, Any]:
    from bench.e2e import run_weights

    return run_weights(nodes=args.nodes, pods=args.pods, weights=tuple(int(w) for w in _names(args.weights)))


def _e2e_instances(args: argparse.Namespace) -> dict[str, Any]:
    from bench.e2e import run_instances

    return run_instances(instances=args.instances, nodes=args.nodes, pods=args.pods)


def _e2e_burst(args: argparse.Namespace) -> dict[str, Any]:
    from bench.e2e import run_burst

    return run_burst(nodes=args.nodes, pods=args.pods)


def _e2e_lambda_watch(args: argparse.Namespace) -> dict[str, Any]:
    from bench.lambda_watch import run

    return run(nodes=args.nodes, period_s=args.period, watch_s=args.watch, invocations=args.invocations,
               churn=args.churn)  # fmt: skip


def _names(text: str) -> list[str]:
    return [name.strip() for name in text.split(",") if name.strip()]


Suite = Callable[[argparse.Namespace], dict[str, Any]]
AddSuite = Callable[[str, Suite, str], argparse.ArgumentParser]
"""Adds one suite's subcommand (its name, the function that runs it, its one-line help) and returns it."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpu-scheduler bench", description=__doc__)
    suites = parser.add_subparsers(dest="suite", required=True)

    def suite(name: str, run: Suite, help_text: str) -> argparse.ArgumentParser:
        sub = suites.add_parser(name, help=help_text)
        sub.set_defaults(run=run)
        return sub

    # In the order ``--help`` lists them.
    _add_in_process_suites(suite)
    _add_refresher_suites(suite)
    _add_request_path_suites(suite)
    _add_placement_suites(suite)
    _add_deployment_suites(suite)
    _add_e2e_suites(suite)
    return parser


def _add_in_process_suites(suite: AddSuite) -> None:
    """The computations timed in this process: the extender's filter and score, and deletion costs."""
    ext = suite("extender", _extender, "core filter+score and the full handle() path")
    ext.add_argument("--nodes", type=int_list, default=[1000, 10000, 100000], help="core table sizes")
    ext.add_argument("--payload-nodes", type=int_list, default=[100, 500, 1000], help="full Node payload sizes")
    ext.add_argument("--repeat", type=int, default=200, help="timed iterations per size")
    ext.add_argument("--seed", type=int, default=1)
    ext.add_argument("--snapshot-nodes", type=int, default=0, help="time the Lambda path over a snapshot this big")
    ext.add_argument(
        "--dra-nodes", type=int, default=5000, help="filter/prioritize with and without DRA read (0: skip)"
    )
    ext.add_argument("--names", type=int_list, default=[1000, 10000, 100000], help="NodeNames per request")
    ext.add_argument(
        "--share-names", type=int_list, default=[1000, 10000], help="names per share prioritize, by share policy"
    )
    ext.add_argument(
        "--share-shapes", type=int_list, default=[35], help="typical pod shapes in the share prioritize's state"
    )
    co = suite("consolidation", _consolidation, "a consolidator's plan on a large cluster; the filter with holds")
    co.add_argument("--nodes", type=int_list, default=[100, 1000, 5000], help="cluster sizes planned on")
    co.add_argument("--filter-nodes", type=int_list, default=[1000, 5000], help="filter sizes, with and without holds")
    co.add_argument("--pending", type=int, default=4, help="8-GPU pods waiting")
    co.add_argument("--moves", type=int, default=8, help="the run's move budget (and a plan's)")
    co.add_argument("--repeat", type=int, default=3)
    co.add_argument("--seed", type=int, default=1)
    dc = suite("deletion-cost", _deletion_cost, "deletion-cost computation for many pods at once")
    dc.add_argument("--pods", type=int_list, default=[1000, 10000, 100000])
    dc.add_argument("--repeat", type=int, default=100)
    dc.add_argument("--seed", type=int, default=1)


def _add_refresher_suites(suite: AddSuite) -> None:
    """The refreshers' runs against the API double, and the state builders against a hostile node."""
    dcr = suite("deletion-cost-run", _deletion_cost_run, "one deletion-cost refresher run against the API double")
    dcr.add_argument("--pods", type=int, default=10_000)
    dcr.add_argument("--seed", type=int, default=0)
    ns = suite("node-state", _node_state, "one node-state refresher run against a synthetic cluster")
    ns.add_argument("--nodes", type=int, default=10_000)
    ns.add_argument("--pods", type=int, default=200_000)
    ns.add_argument("--seed", type=int, default=0)
    ns.add_argument("--concurrency", type=int, default=8, help="label patches in flight")
    caps = suite("node-caps", _node_caps, "one node saying 2**31-1 GPUs: both state builders, beside the healthy nodes")
    caps.add_argument("--nodes", type=int, default=499, help="healthy nodes (the liar is one more)")
    caps.add_argument("--pods-per-node", type=float, default=10.0, help="bound pods per healthy node")
    caps.add_argument("--repeat", type=int, default=5, help="runs of each builder on each cluster (medians)")
    caps.add_argument("--seed", type=int, default=0)
    caps.add_argument("--liar-gpus", type=int, default=2**31 - 1, help="the GPUs the one hostile node says it has")


def _add_request_path_suites(suite: AddSuite) -> None:
    """The modules a request passes through, then binds under contention: the ledger alone and the whole
    bind verb (the same two options each)."""
    suite("path", _path, "the modules filter, prioritize and a share's bind pass through, by a profile hook")
    for name, run, help_text, pods in (
        ("ledger", _ledger, "GPU-ledger binds under contention against moto's DynamoDB server", 2000),
        ("bind", _bind, "the whole bind verb: ledger in moto's server, annotation and Binding", 1000),
    ):
        sub = suite(name, run, help_text)
        sub.add_argument("--threads", type=int, default=8)
        sub.add_argument("--pods", type=int, default=pods)


def _add_placement_suites(suite: AddSuite) -> None:
    """The placement policies on openb traces (synthetic without them)."""
    trace_help = "openb trace name (synthetic when ../shared lacks it)"
    pol = suite("policies", _policies, "placement policies: seconds per seed and cost per decision")
    pol.add_argument(
        "--policies", default="random,dotprod,gpu_clustering,gpu_packing,bestfit,fgd,fgd_cpu", help="comma list"
    )
    pol.add_argument("--trace", default="default", help=trace_help)
    pol.add_argument("--seed", type=int, default=42)
    shp = suite("share-policy", _share_policy, "which policy the extender should place GPU shares with")
    shp.add_argument(
        "--candidates",
        help="comma list (default: fgd, extender, fgd_cpu_blind and every other policy the extender offers)",
    )
    shp.add_argument("--trace", default="default", help=trace_help)
    shp.add_argument("--seeds", type=int, default=10, help="seeds 42, 43, ...")
    shp.add_argument("--jobs", type=int, default=2)
    ks = suite("kube-scores", _kube_scores, "the FGD protocol decided by kube-scheduler's score arithmetic")
    ks.add_argument("--traces", default="", help="comma list of openb traces (default: all; synthetic without them)")
    ks.add_argument("--seeds", type=int, default=5, help="seeds 42, 43, ...")
    ks.add_argument("--weight", type=int, default=None, help="the extender's weight (default: the profile's)")
    ks.add_argument(
        "--plugins", default="most_allocated,balanced_allocation", help="comma list of the score plugins that act"
    )
    ks.add_argument("--jobs", type=int, default=2)
    mv = suite("moves", _moves, "the FGD protocol with a move budget K: unallocated GPU % and moves per 1,000")
    mv.add_argument(
        "--traces", default="public", help="public (with released results), unreleased, all or a comma list"
    )
    mv.add_argument("--seeds", type=int, default=10, help="seeds 42, 43, ...")
    mv.add_argument("--K", type=count_list, default=[0, 1, 2, 4], help="comma list of move budgets")
    mv.add_argument("--jobs", type=int, default=2)
    ch = suite("churn", _churn, "tasks arriving and ending at the trace's times: who waited, with and without moves")
    ch.add_argument("--trace", default="default", help="an openb trace with times (not multigpu*)")
    ch.add_argument("--seeds", type=int, default=3, help="seeds 42, 43, ... (they break ties)")
    ch.add_argument(
        "--loads",
        type=fraction_list,
        default=[0.95, 0.97],
        help="comma list: the busiest moment's demand, as a multiple of the GPUs, that the arrivals are compressed to",
    )
    ch.add_argument("--K", type=count_list, default=[0, 1, 2, 4], help="comma list of move budgets")
    ch.add_argument("--jobs", type=int, default=2)


def _add_deployment_suites(suite: AddSuite) -> None:
    """What deploying costs: the CDK app's synth, and the Lambda's cold start and SnapStart restore (the
    same three options each)."""
    syn = suite("synth", _synth, "make synth: wall time and peak memory of the CDK app")
    syn.add_argument("--runs", type=int, default=3)
    syn.add_argument("--package-dir", type=Path, default=Path("build/lambda"), help="where make package wrote")
    for name, run, help_text in (
        ("cold-start", _cold_start, "fresh interpreter: import + init + first request (S3 via moto)"),
        ("snapstart", _snapstart, "SnapStart's restore stood in for by a fork: first request against warm"),
    ):
        sub = suite(name, run, help_text)
        sub.add_argument("--runs", type=int, default=5)
        sub.add_argument("--snapshot-nodes", type=int, default=10000)
        sub.add_argument("--seed", type=int, default=1)


def _add_e2e_suites(suite: AddSuite) -> None:
    """The product under a real kube-scheduler (the control plane of ``../shared/k8s``)."""
    e2e = suite("e2e", _e2e, "the product under a real kube-scheduler: throughput and packing (../shared/k8s)")
    e2e.add_argument("--nodes", type=int, default=500, help="8-GPU nodes for the whole-GPU runs")
    e2e.add_argument("--pods", type=int, default=1000, help="one-GPU pods per drain")
    e2e.add_argument("--runs", type=int, default=3, help="drains per mode (none, pass-all, ours), alternated")
    e2e.add_argument("--share-nodes", type=int, default=200, help="8-GPU nodes for the share runs")
    e2e.add_argument("--share-pods", type=int, default=400, help="quarter-GPU pods")
    e2e.add_argument("--qps", type=int, default=1000, help="the scheduler's client qps and burst")
    e2e.add_argument("--refresh", default="10s", help="the node-state refresher's period")
    e2e.add_argument("--seed", type=int, default=42, help="which share pods the churn deletes")
    e2e.add_argument("--state", default="live", help="how serve learns the cluster: live (a watch) or snapshot")
    e2e.add_argument("--weight", type=int, default=5, help="the extender's weight in the generated configuration")
    e2e.add_argument(
        "--part", choices=("all", "whole", "shares"), default="all", help="whole GPUs, shares, or both (default)"
    )
    weights = suite("e2e-weights", _e2e_weights, "what the extender's weight changes against PodTopologySpread")
    weights.add_argument("--nodes", type=int, default=24, help="empty 8-GPU nodes")
    weights.add_argument("--pods", type=int, default=48, help="one-GPU pods behind one Service")
    weights.add_argument("--weights", default="1,2,5,10", help="the extender weights to try, after no extender")
    instances = suite("e2e-instances", _e2e_instances, "several serve instances, one ledger, shares bound at once")
    instances.add_argument("--instances", type=int, default=8, help="serve processes behind the round-robin proxy")
    instances.add_argument("--nodes", type=int, default=100, help="8-GPU nodes")
    instances.add_argument("--pods", type=int, default=2000, help="quarter-GPU pods")
    burst = suite("e2e-burst", _e2e_burst, "make demo's burst: default profile alone, then serve --watch")
    burst.add_argument("--nodes", type=int, default=64, help="8-GPU nodes")
    burst.add_argument("--pods", type=int, default=256, help="one-GPU pods")
    watching = suite("e2e-lambda-watch", _e2e_lambda_watch, "the Lambda snapshot's staleness with a watching refresher")
    watching.add_argument("--nodes", type=int, default=500, help="8-GPU nodes")
    watching.add_argument("--period", type=float, default=20.0, help="seconds between invocations (EventBridge's rate)")
    watching.add_argument("--watch", type=float, default=25.0, help="WATCH_S of each invocation")
    watching.add_argument("--invocations", type=int, default=4, help="invocations started")
    watching.add_argument("--churn", type=float, default=5.0, help="other pods created (and deleted) per second")


def main(argv: Sequence[str] | None = None) -> int:
    """Run one suite and print its report; a ValueError from the suite (an unknown policy, a trace the
    openb directory lacks) is a usage error, exit 2."""
    args = build_parser().parse_args(argv)
    try:
        report = args.run(args)
    except ValueError as exc:
        print(f"gpu-scheduler bench {args.suite}: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report, indent=2))
    return 0
