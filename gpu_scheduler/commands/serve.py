"""``gpu-scheduler serve``: the extender as a local HTTP server (development, self-managed clusters, sidecar).

It speaks plain HTTP with no authentication, as kube-scheduler's extender client expects of a sidecar.
With ``--ledger-table`` it serves ``bind``, which writes the GPU ledger and posts Bindings, so it listens
on loopback only, unless ``--insecure`` says the network keeps everyone else out (:func:`check_exposure`).
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
from pathlib import Path

from gpu_scheduler.commands.common import UsageError, add_scoring, locality, weights
from scheduler_core.extender.facade import DEFAULT_MAX_BODY_BYTES, ClusterSource, Extender, ExtenderConfig
from scheduler_core.scoring.share_fit import DEFAULT_SHARE_POLICY, SHARE_POLICIES

HELP = "run the extender as a local HTTP server"
log = logging.getLogger("gpu_scheduler.serve")
SYNC_TIMEOUT_S = 60.0
"""How long ``--watch`` waits for its first lists of nodes and pods before it serves."""
LIVE_MARGIN_S = 10.0
"""How long a reading outlives a live state generated after it, for a pod whose bind the watch never
shows (the watch forgets the others as soon as it shows them)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--host", default="127.0.0.1", help="the address to listen on; with --ledger-table, loopback unless --insecure"
    )
    parser.add_argument("--port", type=int, default=8888, help="0 picks a free port (printed on stdout)")
    state = parser.add_mutually_exclusive_group()
    state.add_argument("--cluster", type=Path, help='JSON {"nodes": [v1 Node], "pods": [v1 Pod]} for GPU usage')
    state.add_argument(
        "--snapshot",
        default=os.environ.get("SNAPSHOT_URI") or None,
        help="cluster snapshot: s3://bucket/key, file:///path or a path (default: $SNAPSHOT_URI)",
    )
    state.add_argument(
        "--watch",
        action="store_true",
        help="decide from the cluster as it is now: list and watch its nodes and pods (--kubeconfig or --kube-url)",
    )
    parser.add_argument(
        "--refresh-s", type=float, default=None, help="re-check the state this often (1 s; 10 s for S3)"
    )
    parser.add_argument("--max-snapshot-age-s", type=float, default=180.0, help="refuse an older snapshot")
    parser.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES)
    parser.add_argument(
        "--share-policy",
        default=DEFAULT_SHARE_POLICY,
        help=f"the pods' policy, one of {', '.join(SHARE_POLICIES)} (fgd_cpu: every pod; the others: shares)",
    )
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
    sharing.add_argument(
        "--insecure",
        action="store_true",
        help="serve bind and preempt on a --host that is not loopback: serve has no TLS and no authentication",
    )
    add_scoring(parser)


def is_loopback(host: str) -> bool:
    """Whether ``host`` only listens where this machine (or its pod: a sidecar shares the pod's network)
    can reach it: ``localhost`` or a loopback address. Any other name counts as reachable from outside,
    whatever it resolves to now.

    >>> [is_loopback(h) for h in ("127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost", "0.0.0.0", "::", "gpu-0")]
    [True, True, True, True, True, False, False, False]
    """
    name = host.strip().removeprefix("[").removesuffix("]").rstrip(".").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def check_exposure(args: argparse.Namespace) -> None:
    """Refuse to serve bind on a non-loopback ``--host`` without ``--insecure``; warn when it is given.

    Raises
    ------
    UsageError
        ``--ledger-table`` with a ``--host`` that is not loopback, and no ``--insecure``.
    """
    exposed = bool(args.ledger_table) and not is_loopback(args.host)
    if exposed and not args.insecure:
        raise UsageError(
            f"--host {args.host} with --ledger-table: serve has no TLS and no authentication, so anyone who "
            "reaches the port could ask it to bind pods and write the GPU ledger. Listen on loopback "
            "(--host 127.0.0.1; a sidecar shares its pod's network), or pass --insecure if the network "
            "itself keeps everyone else out"
        )
    if args.insecure:
        log.warning(
            "--insecure: serving on %s:%s without TLS or authentication%s",
            args.host,
            args.port,
            "; anyone who reaches the port can ask it to bind pods" if args.ledger_table else "",
        )


def run(args: argparse.Namespace) -> int:
    check_exposure(args)
    from adapters.ledger_readings import LedgerReadings
    from adapters.live_state import LiveState, prometheus_text
    from adapters.settings import ClusterAccess
    from gpu_scheduler.server import ClusterFile, print_ready, serve
    from scheduler_core.state.readings import DEFAULT_MARGIN_S

    config = ExtenderConfig(
        weights=weights(args),
        max_body_bytes=args.max_body_bytes,
        locality=locality(args),
        share_policy=args.share_policy,
    ).validated()
    cluster: ClusterSource | None = None
    live = None
    # With a live state, readings older than the state are dropped sooner: it catches up in milliseconds.
    readings = LedgerReadings(margin_s=LIVE_MARGIN_S if args.watch else DEFAULT_MARGIN_S)
    access = ClusterAccess(args.cluster_name, args.kube_url, args.kube_token, args.kubeconfig)
    if args.watch:
        if access.access_problems():
            raise UsageError("--watch needs --kubeconfig, --kube-url or --cluster-name: the cluster to watch")
        live = LiveState(lambda: access.connect(None), label_keys=config.locality.label_keys, readings=readings)
        cluster = live
    elif args.cluster:
        cluster = ClusterFile(args.cluster, refresh_s=1.0 if args.refresh_s is None else args.refresh_s)
    elif args.snapshot:
        from adapters.snapshot_store import DEFAULT_REFRESH_S, SnapshotSource, open_store

        try:
            store = open_store(args.snapshot)
        except ValueError as exc:
            raise UsageError(str(exc)) from exc
        refresh_s = DEFAULT_REFRESH_S if args.refresh_s is None else args.refresh_s
        cluster = SnapshotSource(store, refresh_s=refresh_s, max_age_s=args.max_snapshot_age_s)
    accounting = None
    if args.ledger_table:
        from adapters.binder import ledger_binder

        if access.access_problems():
            raise UsageError("--ledger-table needs --cluster-name, --kube-url or --kubeconfig: bind writes to the API")
        accounting = ledger_binder(args.ledger_table, access, cluster=cluster, readings=readings)
        if live is not None:
            live.on_gone, accounting.gone, accounting.node_of = accounting.release_pod, live.gone_on, live.node
    metrics = None
    if live is not None:
        # Like an informer's cache sync: kube-scheduler parks a pod that got an error until the next cluster
        # event, so serving before the first lists are in would strand the first pods for minutes.
        if not live.start().wait_synced(SYNC_TIMEOUT_S):
            log.warning("the live state is not listed after %.0f s; serving, and answering Error until it is",
                        SYNC_TIMEOUT_S)  # fmt: skip
        metrics = lambda: prometheus_text(live.stats())  # noqa: E731 - a one-line closure over the live state
    try:
        serve(Extender(config, cluster, readings, accounting), args.host, args.port, ready=print_ready, metrics=metrics)
    finally:
        if live is not None:
            live.close()
    return 0
