"""The second scheduler's ``KubeSchedulerConfiguration`` (``kubescheduler.config.k8s.io/v1``): the
``gpu-scheduler`` profile, the ``extenders[]`` entries that call our extender, and the break-glass
configuration without them. ``manifests.scheduler`` ships both in the scheduler's ConfigMap.

Choices that matter (DESIGN sections 4 and 8):

- ``percentageOfNodesToScore: 100`` at the top level (a per-profile value is rejected by the captured
  v1beta3 scheduler), so the extender sees every feasible node: bin-packing needs the whole picture.
- ``nodeCacheCapable: true``: names only, about 7 KB per request instead of about 1.2 MB at 500 nodes.
- No ``managedResources`` (by default): the extender is called for every pod of the profile, those that
  request no GPU included, because where a CPU-only pod's CPU goes decides whether a GPU node's free
  GPUs stay usable (``docs/scheduling.md#one-policy-for-every-pod``; on openb ``default`` through the real
  kube-scheduler, 11.03 % of GPUs left unallocated with the CPU-only pods left to kube-scheduler's
  plugins). ``nvidia.com/gpu`` stays counted by the scheduler. With sharing on, kube-scheduler does not
  count ``gpu-scheduler.io/gpu-milli`` (NodeResourcesFit's ``ignoredResources``), because then the
  extender's bind verb owns that accounting; without sharing a milli request stays unschedulable instead
  of landing on a node with no accounting at all (the captured ``03c``/``03d`` runs show kube-scheduler
  binding such pods anywhere). ``gpu_pods_only`` restores ``managedResources`` (``nvidia.com/gpu``, and
  ``gpu-milli`` with ``ignoredByScheduler: true`` when sharing, and every ``nvidia.com/mig-<profile>`` of
  ``scheduler_core.k8s.mig.KNOWN_PROFILES``): the extender then sees GPU pods only.
- ``clientConnection`` qps 100 and burst 200: the default 50/100 caps binds at about 50 pods/s.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

from manifests.reservation import reserving
from manifests.scheduler_options import SchedulerOptions
from scheduler_core.k8s.mig import known_mig_resources
from scheduler_core.k8s.names import GPU_RESOURCE, MILLI_RESOURCE, SCHEDULER_NAME


def _duration(seconds: float) -> str:
    """A Go duration string: ``3s``, ``1500ms``."""
    return f"{int(seconds)}s" if float(seconds).is_integer() else f"{round(seconds * 1000)}ms"


def extender_entries(options: SchedulerOptions) -> list[dict[str, Any]]:
    """The ``extenders[]`` of the KubeSchedulerConfiguration: :func:`extender_entry`, and with sharing and
    reservation pods a second entry at the same URL for ``bind`` only, with its own ``httpTimeout``.

    kube-scheduler gives each extender one ``httpTimeout`` for all its verbs. Filter and prioritize run in
    its scheduling cycle, one pod at a time, and keep the short one; the bind of the first share on a GPU
    waits for the reservation pod to report the GPU's UUID (``manifests/share_env.py``), in the binding
    cycle, which runs apart for each pod. A scheduler allows one binder among its extenders: the entry
    that filters does not bind then.
    """
    main = extender_entry(options)
    if not (options.sharing and reserving(options.reservation_image)):
        return [main]
    main.pop("bindVerb")
    binder = {
        "urlPrefix": main["urlPrefix"],
        "bindVerb": "bind",
        "enableHTTPS": main["enableHTTPS"],
        "httpTimeout": _duration(options.bind_http_timeout_s),
        "nodeCacheCapable": main["nodeCacheCapable"],
    }
    if "managedResources" in main:
        binder["managedResources"] = copy.deepcopy(main["managedResources"])
    return [main, binder | {"ignorable": False}]


def extender_entry(options: SchedulerOptions) -> dict[str, Any]:
    """The ``extenders[]`` entry that filters and prioritizes (and, with sharing, preempts and binds,
    unless :func:`extender_entries` gives the bind its own) (v1 field names)."""
    managed: list[dict[str, Any]] = [{"name": GPU_RESOURCE, "ignoredByScheduler": False}]
    # managedResources matches exact names: every MIG profile the product knows (mixed strategy).
    managed += [{"name": name, "ignoredByScheduler": False} for name in known_mig_resources()]
    entry: dict[str, Any] = {
        "urlPrefix": options.extender_url.rstrip("/"),
        "filterVerb": "filter",
        "prioritizeVerb": "prioritize",
    }
    if options.sharing:
        entry |= {"bindVerb": "bind", "preemptVerb": "preempt"}
        managed.append({"name": MILLI_RESOURCE, "ignoredByScheduler": True})
    entry |= {
        "weight": options.weight,
        "enableHTTPS": options.extender_url.startswith("https://"),
        "httpTimeout": _duration(options.http_timeout_s),
        "nodeCacheCapable": options.node_cache_capable,
    }
    if options.gpu_pods_only:
        entry["managedResources"] = managed
    # Not ignorable: a GPU pod placed without the extender's view is worse than a retried one.
    return entry | {"ignorable": False}


def scheduler_configuration(options: SchedulerOptions) -> dict[str, Any]:
    """The ``KubeSchedulerConfiguration`` the second scheduler runs with.

    >>> config = scheduler_configuration(SchedulerOptions(extender_url="https://x.example/prod"))
    >>> config["profiles"][0]["schedulerName"], config["percentageOfNodesToScore"], config["extenders"][0]["urlPrefix"]
    ('gpu-scheduler', 100, 'https://x.example/prod')
    """
    options.validated()
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"qps": options.client_qps, "burst": options.client_burst},
        "leaderElection": {
            "leaderElect": True,
            "resourceLock": "leases",
            "resourceName": SCHEDULER_NAME,
            "resourceNamespace": options.namespace,
        },
        "percentageOfNodesToScore": 100,
        "profiles": [profile(options)],
        "extenders": extender_entries(options),
    }


def break_glass_configuration(options: SchedulerOptions) -> dict[str, Any]:
    """The second scheduler without the extender, for when the extender cannot answer (its API, its
    snapshot, its network): the same profile, leader election and packing, and no ``extenders``, so that
    every pod of the profile is placed by kube-scheduler's own plugins. ``nvidia.com/gpu`` stays counted by
    kube-scheduler; ``gpu-scheduler.io/gpu-milli`` is no longer ignored, so a share, which only the
    extender's bind can account, waits (Pending, ``Insufficient gpu-scheduler.io/gpu-milli``) instead of
    landing on a GPU no ledger knows of.

    >>> config = break_glass_configuration(SchedulerOptions(extender_url="https://x.example/prod", sharing=True))
    >>> "extenders" in config, config["profiles"][0]["pluginConfig"][0]["args"].get("ignoredResources")
    (False, None)
    """
    config = scheduler_configuration(replace(options, sharing=False))
    del config["extenders"]
    return config


def profile(options: SchedulerOptions) -> dict[str, Any]:
    """The ``gpu-scheduler`` profile: the default plugins, with NodeResourcesFit's score set to pack.

    kube-scheduler adds the extender's score (weight x 10 x 0..10) to its score plugins' (0..100 each,
    times their weights). Its default NodeResourcesFit scores ``LeastAllocated`` on CPU and memory: on
    nodes the extender scores alike (every empty node, or every node for a share when the policy sees
    no difference) it sends each pod to the emptiest, one per node. ``MostAllocated`` on CPU, memory
    and ``nvidia.com/gpu`` breaks those ties toward the fullest node instead. The GPUs weigh as much as
    CPU and memory, no more: ``MostAllocated`` scores a GPU pod by the share of the node's GPUs taken,
    which favours the nodes with few GPUs, and weighted 5 it outvoted the extender's ranking (one step
    of its 0..10 is worth 50 points at weight 5): through the real kube-scheduler, openb ``gpuspec33``
    left 13.65 % of GPUs unallocated against 12.63 with weight 1
    (docs/benchmarks.md#placement-quality-through-the-real-kube-scheduler-replay). The other
    default score plugins keep acting (docs/scheduling.md says which and why). With sharing, and no
    ``managedResources`` to say so, NodeResourcesFit ignores ``gpu-scheduler.io/gpu-milli``: the
    extender's bind accounts it.
    """
    fit_args: dict[str, Any] = {}
    if options.bin_pack:
        resources = [{"name": "cpu", "weight": 1}, {"name": "memory", "weight": 1}, {"name": GPU_RESOURCE, "weight": 1}]
        fit_args["scoringStrategy"] = {"type": "MostAllocated", "resources": resources}
    if options.sharing and not options.gpu_pods_only:
        fit_args["ignoredResources"] = [MILLI_RESOURCE]
    if not fit_args:
        return {"schedulerName": SCHEDULER_NAME}
    return {"schedulerName": SCHEDULER_NAME, "pluginConfig": [{"name": "NodeResourcesFit", "args": fit_args}]}
