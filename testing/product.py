"""The product's own processes, started as a user starts them: ``gpu-scheduler serve`` and
``gpu-scheduler refresh``, plus a pass-all extender to compare against.

Each runs in its own session with its log in the work folder, and :class:`Processes` stops them by PID
(TERM, then KILL), on error too.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import urllib.request
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

from scheduler_core.k8s.annotations import parse_assigned_gpus
from scheduler_core.k8s.names import ASSIGNED_GPUS_ANNOTATION
from testing.processes import log_tail, serve_in_thread, stop_group

CLI = [sys.executable, "-m", "gpu_scheduler"]


@dataclass
class Processes:
    """Processes started for one test or one benchmark run, stopped together."""

    workdir: Path
    running: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def __enter__(self) -> Processes:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop_all()

    def start(self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
        log = (self.workdir / f"{name}.log").open("ab")
        process = subprocess.Popen(
            list(argv), stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})}, start_new_session=True,
        )  # fmt: skip
        log.close()
        self.running[name] = process
        return process

    def serve(self, name: str, args: Sequence[str], env: Mapping[str, str] | None = None) -> str:
        """``gpu-scheduler serve --port 0 ARGS``; the URL it announces on stdout."""
        return self._announced(name, [*CLI, "serve", "--port", "0", *args], env)

    def pass_all(self, name: str, api_url: str, token: str) -> str:
        """The pass-all extender (:class:`PassAll`) in its own process; its URL."""
        return self._announced(name, [sys.executable, "-m", "testing.product", api_url, token], None)

    def _announced(self, name: str, argv: Sequence[str], env: Mapping[str, str] | None) -> str:
        process = self.start(name, argv, env)
        assert process.stdout is not None
        line = process.stdout.readline()
        if not line:
            process.wait(timeout=10)
            raise RuntimeError(f"{name} exited with {process.returncode}: {self.tail(name)}")
        url: str = json.loads(line)["serving"]
        threading.Thread(target=_drain, args=(process.stdout,), daemon=True).start()
        return url

    def refresher(self, name: str, args: Sequence[str], env: Mapping[str, str] | None = None) -> None:
        """``gpu-scheduler refresh ARGS`` on its loop; its reports go to ``<name>.reports``."""
        process = self.start(name, [*CLI, "refresh", *args], env)
        assert process.stdout is not None
        threading.Thread(target=_copy, args=(process.stdout, self.workdir / f"{name}.reports"), daemon=True).start()

    def reports(self, name: str) -> list[dict[str, Any]]:
        path = self.workdir / f"{name}.reports"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def tail(self, name: str, lines: int = 20) -> str:
        return log_tail(self.workdir / f"{name}.log", lines)

    def stop(self, name: str) -> None:
        process = self.running.pop(name, None)
        if process is not None:
            stop_group(process)

    def stop_all(self) -> None:
        for name in reversed(list(self.running)):
            self.stop(name)


REQUESTS_TOTAL = re.compile(r'^gpu_scheduler_extender_requests_total\{verb="(\w+)",status="\d+"\} (\d+)$', re.M)


def requests_served(url: str) -> Counter[str]:
    """The replies ``gpu-scheduler serve`` at ``url`` has sent, by verb (its ``/metrics``), all statuses."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as response:
        text = response.read().decode()
    served: Counter[str] = Counter()
    for verb, count in REQUESTS_TOTAL.findall(text):
        served[verb] += int(count)
    return served


def share_usage(pods: Sequence[Mapping[str, Any]], ledger: Sequence[Any]) -> dict[str, Any]:
    """What the bound pods' ``assigned-gpus`` annotations hold, checked against the ledger's items
    (``LedgerStore.scan()``): GPUs and nodes in use, GPUs over 1000 milli, those under it (node/GPU to
    milli), bound pods without an annotation, and whether the ledger holds exactly the annotations (pod
    UID by pod UID)."""
    per_gpu: Counter[tuple[str, int]] = Counter()
    annotated: dict[str, dict[str, tuple[tuple[int, int], ...]]] = {}
    unannotated = 0
    for pod in pods:
        node = pod["spec"].get("nodeName")
        if not node:
            continue
        text = (pod["metadata"].get("annotations") or {}).get(ASSIGNED_GPUS_ANNOTATION)
        if text is None:
            unannotated += 1
            continue
        pairs = parse_assigned_gpus(text)
        annotated.setdefault(node, {})[pod["metadata"]["uid"]] = pairs
        for gpu, milli in pairs:
            per_gpu[(node, gpu)] += milli
    held = {item.node: dict(item.assignments) for item in ledger if item.assignments}
    return {
        "gpus_used": len(per_gpu),
        "nodes_used": len({node for node, _ in per_gpu}),
        "gpus_over_1000_milli": sum(1 for milli in per_gpu.values() if milli > 1000),
        "gpus_partly_used": {f"{node}/{gpu}": milli for (node, gpu), milli in sorted(per_gpu.items()) if milli < 1000},
        "bound_without_annotation": unannotated,
        "ledger_equals_annotations": held == annotated,
        "ledger_extra_pods": sum(len(set(held.get(n, {})) - set(annotated.get(n, {}))) for n in held),
    }


def reservation_agreement(
    pods: Sequence[Mapping[str, Any]], reservations: Sequence[Mapping[str, Any]], device: str = "cdi"
) -> dict[str, Any]:
    """Whether the reservation pods (those of ``manifests/reservation.py``'s namespace, ``reservations``)
    are exactly one per GPU that the bound shares among ``pods`` hold, by their ``assigned-gpus``: the GPUs
    that have none (``missing``), the reservation pods of GPUs without shares (``orphans``), and how many
    report their GPU's UUID (``uuids``, all distinct on a node, counted in ``uuid_clashes`` otherwise).
    Each bound share's containers are given the GPUs a runtime set up for ``SHARE_DEVICE`` ``device`` would
    give them (:func:`manifests.share_env.container_gpus`: the CDI devices the pod's annotations name, or the
    ``NVIDIA_VISIBLE_DEVICES`` the kubelet resolves from their ``env``): ``containers_wrong_gpu`` counts those
    not given exactly the UUID their GPU's reservation pod reported (of ``containers_checked``)."""
    from manifests.reservation import reservation_name
    from manifests.share_env import container_gpus
    from scheduler_core.k8s.names import MILLI_PER_GPU, RESERVED_GPU_ANNOTATION
    from scheduler_core.state.allocation import reservation_of

    shared: set[tuple[str, int]] = set()
    on_gpu: list[tuple[tuple[str, int], Mapping[str, Any]]] = []
    for pod in pods:
        node = pod["spec"].get("nodeName")
        text = (pod["metadata"].get("annotations") or {}).get(ASSIGNED_GPUS_ANNOTATION)
        if node and text:
            slots = [(node, gpu) for gpu, milli in parse_assigned_gpus(text) if milli < MILLI_PER_GPU]
            shared.update(slots)
            on_gpu += [(slot, pod) for slot in slots]
    held: dict[tuple[str, int], str] = {}
    uuids: Counter[tuple[str, str]] = Counter()
    for pod in reservations:
        slot = reservation_of(pod)
        if slot is None or pod["metadata"]["name"] != reservation_name(*slot):
            continue
        held[slot] = (pod["metadata"].get("annotations") or {}).get(RESERVED_GPU_ANNOTATION, "")
        if held[slot]:
            uuids[(slot[0], held[slot])] += 1
    return {
        "gpus_with_shares": len(shared),
        "reservation_pods": len(held),
        "missing": sorted(shared - set(held)),
        "orphans": sorted(set(held) - shared),
        "uuids": sum(uuids.values()),
        "uuid_clashes": sum(count - 1 for count in uuids.values()),
        "containers_checked": sum(len(pod["spec"]["containers"]) for _slot, pod in on_gpu),
        "containers_wrong_gpu": sum(
            1
            for slot, pod in on_gpu
            for container in pod["spec"]["containers"]
            if not held.get(slot) or container_gpus(pod, container, device) != (held[slot],)
        ),
    }


def _drain(stream: Any) -> None:
    for _ in stream:
        pass


def _copy(stream: Any, path: Path) -> None:
    with path.open("ab") as out:
        for line in stream:
            out.write(line)
            out.flush()


class PassAll(BaseHTTPRequestHandler):
    """An extender that keeps every node it is sent, names only: the cheapest reply kube-scheduler can get,
    over keep-alive with TCP_NODELAY, as DESIGN section 8 measured. With ``api`` set it also serves
    ``bind``, with one Binding POST and nothing else, as the capture's logging extender did."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    api: Any = None  # testing.kube_rest.KubeRest, for bind

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
        verb = self.path.rstrip("/").rsplit("/", 1)[-1]
        names = body.get("NodeNames") or [n["metadata"]["name"] for n in (body.get("Nodes") or {}).get("items", [])]
        if verb == "bind":
            binding = {"apiVersion": "v1", "kind": "Binding",
                       "metadata": {"name": body["PodName"], "uid": body["PodUID"]},
                       "target": {"apiVersion": "v1", "kind": "Node", "name": body["Node"]}}  # fmt: skip
            path = f"/api/v1/namespaces/{body['PodNamespace']}/pods/{body['PodName']}/binding"
            status, raw = self.api.raw("POST", path, json.dumps(binding).encode(), "application/json")
            reply: Any = {"Error": "" if status == 201 else raw.decode(errors="replace")[:300]}
        elif verb == "prioritize":
            reply = [{"Host": name, "Score": 0} for name in names]
        else:
            reply = {
                "Nodes": None,
                "NodeNames": names,
                "FailedNodes": {},
                "FailedAndUnresolvableNodes": {},
                "Error": "",
            }
        data = json.dumps(reply).encode()
        self.wfile.write(
            f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n".encode() + data
        )

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's signature
        pass


class PassAllServer:
    """:class:`PassAll` on a free loopback port, in a thread of this process (``python -m testing.product
    API_URL TOKEN`` runs one in its own, as the benchmarks do)."""

    def __init__(self, api: Any = None) -> None:
        self.server = serve_in_thread(type("BoundPassAll", (PassAll,), {"api": api}))
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class RoundRobin(BaseHTTPRequestHandler):
    """Forwards each POST to the next of ``backends`` in turn, as API Gateway spreads calls over Lambda
    instances: kube-scheduler's filter, prioritize and bind of one pod may each reach another instance."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    backends: tuple[str, ...] = ()
    turn: Any = None  # itertools.count, shared by every connection

    def do_POST(self) -> None:
        import http.client
        import urllib.parse

        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        backend = urllib.parse.urlsplit(self.backends[next(self.turn) % len(self.backends)])
        connection = http.client.HTTPConnection(backend.hostname, backend.port, timeout=30)
        try:
            connection.request("POST", self.path, body, {"Content-Type": "application/json"})
            response = connection.getresponse()
            status, data = response.status, response.read()
        except (OSError, http.client.HTTPException) as exc:  # as API Gateway answers for a failed backend
            status, data = 502, json.dumps({"Error": f"backend {backend.netloc}: {exc!r}"}).encode()
        finally:
            connection.close()
        self.wfile.write(
            f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n".encode()
            + data
        )

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's signature
        pass


class RoundRobinServer:
    """:class:`RoundRobin` over ``backends`` on a free loopback port, in a thread of this process."""

    def __init__(self, backends: Sequence[str]) -> None:
        import itertools

        handler = type("BoundRoundRobin", (RoundRobin,), {"backends": tuple(backends), "turn": itertools.count()})
        self.server = serve_in_thread(handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


if __name__ == "__main__":
    from testing.kube_rest import KubeRest

    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    server = PassAllServer(KubeRest(sys.argv[1], sys.argv[2]))
    sys.stdout.write(json.dumps({"serving": server.url, "pid": os.getpid()}) + "\n")
    sys.stdout.flush()
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    server.close()
