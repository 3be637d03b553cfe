"""``gpu-scheduler serve``: the extender as a local HTTP server (development, self-managed clusters, sidecar)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from gpu_scheduler.commands.common import UsageError, add_scoring, locality, weights
from scheduler_core.extender.facade import DEFAULT_MAX_BODY_BYTES, ClusterSource, Extender, ExtenderConfig
from scheduler_core.scoring.share_fit import DEFAULT_SHARE_POLICY, SHARE_POLICIES

HELP = "run the extender as a local HTTP server"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8888, help="0 picks a free port (printed on stdout)")
    state = parser.add_mutually_exclusive_group()
    state.add_argument("--cluster", type=Path, help='JSON {"nodes": [v1 Node], "pods": [v1 Pod]} for GPU usage')
    state.add_argument(
        "--snapshot",
        default=os.environ.get("SNAPSHOT_URI") or None,
        help="cluster snapshot: s3://bucket/key, file:///path or a path (default: $SNAPSHOT_URI)",
    )
    parser.add_argument(
        "--refresh-s", type=float, default=None, help="re-check the state this often (1 s; 10 s for S3)"
    )
    parser.add_argument("--max-snapshot-age-s", type=float, default=180.0, help="refuse an older snapshot")
    parser.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES)
    parser.add_argument("--share-policy", default=DEFAULT_SHARE_POLICY, help=f"one of {', '.join(SHARE_POLICIES)}")
    sharing = parser.add_argument_group("GPU sharing: with --ledger-table, bind and preempt are served")
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
    add_scoring(parser)


def run(args: argparse.Namespace) -> int:
    from adapters.ledger_readings import LedgerReadings
    from gpu_scheduler.server import ClusterFile, print_ready, serve

    config = ExtenderConfig(
        weights=weights(args),
        max_body_bytes=args.max_body_bytes,
        locality=locality(args),
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
