"""``gpu-scheduler serve``: the extender as a local HTTP server (trying it, development, beside a
kube-scheduler you run yourself; the stack deploys the Lambda, not this).

It speaks plain HTTP with no authentication, as kube-scheduler's extender client expects on loopback.
With ``--ledger-table`` it serves ``bind``, which writes the GPU ledger and posts Bindings, so it listens
on loopback only, unless ``--insecure`` says the network keeps everyone else out (:func:`check_exposure`).
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
from pathlib import Path

from adapters.settings import add_flags, env_name, flag_names
from application.extender.settings import ExtenderSettings
from gpu_scheduler.commands.common import SCORING, UsageError, add_scoring, extender_settings
from scheduler_core.errors import ConfigError
from scheduler_core.extender.facade import DEFAULT_MAX_BODY_BYTES

HELP = "run the extender as a local HTTP server"
log = logging.getLogger("gpu_scheduler.serve")
SOURCE = ("snapshot_uri",)
LIMITS = ("snapshot_refresh_s", "max_snapshot_age_s", "max_body_bytes", "share_policy", "holds_uri")
LEDGER = ("ledger_table", "reservation_image", "share_device")
ACCESS = ("cluster_name", "kube_api_url", "kube_token", "kubeconfig")
SETTINGS = (*SOURCE, *LIMITS, *SCORING, *LEDGER, *ACCESS)
"""The extender settings ``serve`` takes as flags (:func:`adapters.settings.add_flags`), by group: the
Lambda's, but for its metrics' names and AWS_REGION (boto3's own)."""
FROM_ENV = (*SOURCE, *ACCESS)
"""The settings whose variable ``serve`` reads when the flag is not given. The others come from flags only:
a variable meant for the Lambda (``LEDGER_TABLE``, say) must not turn bind on in a process that sees it."""
DEFAULTS = {"max_body_bytes": DEFAULT_MAX_BODY_BYTES}
"""Where ``serve``'s default differs from the Lambda's: no 6 MB invocation limit on a plain HTTP server."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--host", default="127.0.0.1", help="the address to listen on; with --ledger-table, loopback unless --insecure"
    )
    parser.add_argument("--port", type=port, default=8888, help="0 picks a free port (printed on stdout)")
    state = parser.add_mutually_exclusive_group()
    state.add_argument(
        "--cluster",
        type=Path,
        help="the cluster from a file, JSON or YAML: what kubectl get nodes,pods -A -o json prints, or "
        '{"nodes": [v1 Node], "pods": [v1 Pod]}',
    )
    add_flags(state, ExtenderSettings, SOURCE, from_env=True)
    state.add_argument(
        "--watch",
        action="store_true",
        help="decide from the cluster as it is now: list and watch its nodes and pods (--kubeconfig or --kube-url)",
    )
    add_flags(parser, ExtenderSettings, LIMITS, defaults=DEFAULTS)
    sharing = parser.add_argument_group("GPU sharing: with --ledger-table, bind and preempt are served")
    add_flags(sharing, ExtenderSettings, LEDGER)
    add_flags(sharing, ExtenderSettings, ACCESS, from_env=True)
    sharing.add_argument(
        "--insecure",
        action="store_true",
        help="serve bind and preempt on a --host that is not loopback: serve has no TLS and no authentication",
    )
    add_scoring(parser)


def port(text: str) -> int:
    """A TCP port, 0..65535 (an argparse ``type``: a bad one is a usage error, exit 2)."""
    if not text.strip().isdigit() or not 0 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port number in 0..65535 (0: any free port), got {text!r}")
    return int(text)


def settings(args: argparse.Namespace) -> ExtenderSettings:
    """The extender settings of ``args``: the flags given, else the variables of :data:`FROM_ENV`, else
    :data:`DEFAULTS`, else the declared defaults; :class:`UsageError` naming each bad flag."""
    environ = {name: os.environ.get(name, "") for name in (env_name(ExtenderSettings, f) for f in FROM_ENV)}
    return extender_settings(args, SETTINGS, environ=environ, values=DEFAULTS)


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
    from application.extender.service import build
    from gpu_scheduler.server import print_ready, serve

    check_exposure(args)
    if args.kubeconfig and not Path(args.kubeconfig).is_file():
        raise UsageError(f"--kubeconfig {args.kubeconfig}: no such file")
    config = settings(args)
    try:
        service = build(
            config,
            cluster_file=args.cluster,
            watch=args.watch,
            decision_level=logging.DEBUG,
            named_by=flag_names(ExtenderSettings),
        )
    except ConfigError as exc:
        raise UsageError(str(exc)) from exc
    try:
        service.start()
        serve(service, args.host, args.port, ready=print_ready)
    except OSError as exc:  # the listening socket: a port in use, an address this machine does not have
        raise UsageError(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}") from exc
    finally:
        service.close()
    return 0
