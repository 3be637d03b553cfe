"""``gpu-scheduler scheduler-config``: the second kube-scheduler's manifests."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HELP = "the second kube-scheduler's manifests (RBAC, configuration, Deployment)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options, in ``--help``'s order: the extender's, the scheduler pods', sharing's, Karpenter's, the
    pods' network, then what to leave out and where to write."""
    _add_extender_arguments(parser)
    _add_scheduler_pod_arguments(parser)
    _add_sharing_arguments(parser)
    _add_karpenter_arguments(parser)
    _add_pod_network_arguments(parser)
    parser.add_argument(
        "--no-admission-policy",
        action="store_true",
        help="leave out the ValidatingAdmissionPolicies (Kubernetes older than 1.30; CDK admissionPolicy=false)",
    )
    parser.add_argument("--namespace", default="kube-system")
    parser.add_argument("--out", type=Path, help="write here (default: stdout)")


def _add_extender_arguments(parser: argparse.ArgumentParser) -> None:
    """How kube-scheduler calls the extender: its URL, verbs, weight, timeout and which pods."""
    parser.add_argument(
        "--url", required=True, help="the extender's base URL, stage included (https://..., or http://127.0.0.1:PORT)"
    )
    parser.add_argument("--sharing", action="store_true", help="fractional GPUs: add the bind and preempt verbs")
    parser.add_argument(
        "--consolidation",
        action="store_true",
        help="the consolidator's RBAC and admission policy (docs/consolidation.md; the stack's consolidation)",
    )
    parser.add_argument("--weight", type=int, default=5, help="the extender's weight in kube-scheduler (default 5)")
    parser.add_argument("--http-timeout-s", type=float, default=3.0, help="kube-scheduler's httpTimeout (default 3)")
    parser.add_argument(
        "--full-nodes", action="store_true", help="send full Node objects (nodeCacheCapable: false; small clusters)"
    )
    parser.add_argument(
        "--gpu-pods-only",
        action="store_true",
        help="call the extender only for pods that request a GPU (managedResources); by default every pod of "
        "the profile, so that CPU-only pods strand no GPU",
    )


def _add_scheduler_pod_arguments(parser: argparse.ArgumentParser) -> None:
    """The scheduler pods' API client rate and image."""
    parser.add_argument("--client-qps", type=int, default=100, help="the scheduler's API client qps (default 100)")
    parser.add_argument("--client-burst", type=int, default=200, help="and its burst (default 200)")
    parser.add_argument("--image", help="kube-scheduler image; match the cluster's minor version")


def _add_sharing_arguments(parser: argparse.ArgumentParser) -> None:
    """With --sharing: the reservation pods, the bind's timeout, and how a share's GPU reaches its containers."""
    parser.add_argument(
        "--reservation-image",
        help="with --sharing: the image of the pods that hold shared GPUs in Kubernetes' count (default "
        "public.ecr.aws/docker/library/python:3.12-slim; 'none': no reservation pods). The extender's and the "
        "node-state refresher's RESERVATION_IMAGE must match",
    )
    parser.add_argument(
        "--bind-http-timeout-s",
        type=float,
        default=15.0,
        help="with reservation pods: the bind's own httpTimeout, which covers the wait for a new GPU's UUID "
        "(default 15)",
    )
    parser.add_argument(
        "--mutating-policy",
        choices=("v1alpha1", "v1beta1", "v1"),
        help="with reservation pods: add the MutatingAdmissionPolicy that gives share pods their GPU's "
        "environment, in this admissionregistration.k8s.io version (1.32-1.33: v1alpha1, 1.34-1.35: v1beta1, "
        "1.36+: v1; "
        "the API server must serve it). Without it, share pods carry the env entries themselves",
    )
    parser.add_argument(
        "--share-device",
        choices=("cdi", "env"),
        default="cdi",
        help="with reservation pods: how a share's GPU reaches its containers, as the extender's SHARE_DEVICE "
        "(default cdi: a CDI device no tenant can name; env: NVIDIA_VISIBLE_DEVICES, which lets any pod on a GPU "
        "node name any GPU there; docs/sharing.md)",
    )


def _add_karpenter_arguments(parser: argparse.ArgumentParser) -> None:
    """The Karpenter NodePools for GPU nodes (docs/autoscalers.md)."""
    parser.add_argument(
        "--karpenter-node-class",
        default="",
        help="add Karpenter NodePools for GPU nodes (whole GPUs; with --sharing, shares too) on this EC2NodeClass "
        "(docs/autoscalers.md)",
    )
    parser.add_argument(
        "--karpenter-consolidation",
        choices=("WhenEmpty", "WhenEmptyOrUnderutilized"),
        default="WhenEmpty",
        help="the whole-GPU NodePool's consolidation policy (default WhenEmpty; the shared pool's is always WhenEmpty)",
    )


def _add_pod_network_arguments(parser: argparse.ArgumentParser) -> None:
    """How the scheduler pods reach the extender API's endpoint: its security group, or a node group in it."""
    parser.add_argument(
        "--security-group",
        default="",
        metavar="SG_ID",
        help="the security group the extender API's endpoint admits (the stack's SchedulerSecurityGroupId output): "
        "the scheduler pods get it from a SecurityGroupPolicy (Security Groups for Pods: the VPC CNI's "
        "ENABLE_POD_ENI=true), and no other SecurityGroupPolicy may name it",
    )
    parser.add_argument(
        "--node-selector",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="instead: run the scheduler pods on the nodes with this label (a node group in --security-group), "
        "tolerating taints with its key; repeat for more labels",
    )


NO_POD_NETWORK_WARNING = (
    "neither --security-group nor --node-selector: the scheduler pods keep their nodes' security groups, "
    "and the extender API's endpoint refuses them unless one of those is the group it admits; kube-scheduler "
    "then fails every pod of the profile (docs/deploy.md#the-scheduler-pods-security-group)"
)


def run(args: argparse.Namespace) -> int:
    from application.extender.settings import CDI_RUNTIME, ENV_DEVICE_WARNING
    from gpu_scheduler.commands.common import UsageError
    from manifests.scheduler import all_manifests, render_yaml
    from manifests.scheduler_options import DEFAULT_IMAGE, SchedulerOptions, parse_node_selector

    selector, bad = parse_node_selector(args.node_selector)
    if bad:
        raise UsageError(f"--node-selector: expected KEY=VALUE, got {bad[0]!r}")

    options = SchedulerOptions(
        extender_url=args.url,
        sharing=args.sharing,
        consolidation=args.consolidation,
        weight=args.weight,
        http_timeout_s=args.http_timeout_s,
        bind_http_timeout_s=args.bind_http_timeout_s,
        mutating_policy=f"admissionregistration.k8s.io/{args.mutating_policy}" if args.mutating_policy else "",
        node_cache_capable=not args.full_nodes,
        gpu_pods_only=args.gpu_pods_only,
        karpenter_node_class=args.karpenter_node_class,
        karpenter_consolidation=args.karpenter_consolidation,
        client_qps=args.client_qps,
        client_burst=args.client_burst,
        image=args.image or DEFAULT_IMAGE,
        namespace=args.namespace,
        share_device=args.share_device,
        security_group=args.security_group,
        node_selector=selector,
        **({} if args.reservation_image is None else {"reservation_image": args.reservation_image}),
    ).validated()
    header = "Generated by `gpu-scheduler scheduler-config`."
    if options.extender_url.startswith("https://") and not (options.security_group or options.node_selector):
        print(f"warning: {NO_POD_NETWORK_WARNING}", file=sys.stderr)
        header += f"\nWARNING: {NO_POD_NETWORK_WARNING}"
    if options.sharing and options.share_device == "env":
        print(f"warning: {ENV_DEVICE_WARNING}", file=sys.stderr)
        header += f"\nWARNING: {ENV_DEVICE_WARNING}"
    elif options.sharing:
        header += f"\n{CDI_RUNTIME}"
    text = render_yaml(all_manifests(options, admission_policy=not args.no_admission_policy), header=header)
    if args.out is None:
        sys.stdout.write(text)
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0
