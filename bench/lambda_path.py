"""The extender Lambda's full event-to-response path over a large snapshot, and its cold start.

``gpu-scheduler bench extender --snapshot-nodes 100000 --names 1000,10000,100000 --json`` times
``lambda_handler(event, context)`` on API Gateway REST proxy events carrying ``NodeNames`` (the
``nodeCacheCapable: true`` form), with the snapshot already loaded, as in a warm Lambda.
``gpu-scheduler bench cold-start --json`` times a fresh interpreter: import and init of the handler
module, then the first request, which loads the snapshot from S3 (moto's server on loopback).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from bench.timing import time_us
from scheduler_core.simulator.synthetic import make_pod
from scheduler_core.state.snapshot import write_snapshot
from testing.synthetic import synthetic_snapshot


class _Discard:
    """A stdout that drops what the handler prints (EMF and logs), so the JSON report stays clean."""

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass


class _Context:
    function_name = "gpu-scheduler-extender"
    memory_limit_in_mb = 512
    invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:gpu-scheduler-extender"
    aws_request_id = "bench"


def _event(path: str, body: str) -> dict[str, Any]:
    return {
        "resource": path,
        "path": path,
        "httpMethod": "POST",
        "headers": {"Content-Type": "application/json"},
        "multiValueHeaders": {},
        "queryStringParameters": None,
        "pathParameters": None,
        "requestContext": {"resourcePath": path, "httpMethod": "POST", "stage": "prod", "requestId": "bench"},
        "body": body,
        "isBase64Encoded": False,
    }


def warm_path(snapshot_nodes: int, names: list[int], repeat: int, seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    snapshot = synthetic_snapshot(snapshot_nodes, rng, generated_at=time.time())
    all_names = np.array(snapshot.table.names)
    pod = make_pod("bench", 2, models="A100,H100,L40S", memory="40Gi")
    peered = make_pod("bench-peers", 2, models="A100,H100,L40S", memory="40Gi")
    peered["metadata"]["labels"] = {"app": "svc-9"}
    peered["metadata"]["annotations"]["gpu-scheduler.io/peers"] = "app=svc-1:3,app=svc-2:1,app=svc-3:1"
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "snapshot.npz"
        path.write_bytes(write_snapshot(snapshot))
        os.environ["SNAPSHOT_URI"] = str(path)
        sink = _Discard()
        with contextlib.redirect_stdout(sink):
            import lambdas.extender.handler as handler

            handler = importlib.reload(handler)
            handler.logger.logger_handler.stream = sink  # type: ignore[attr-defined]
            results = []
            for count in names:
                picked = rng.choice(all_names, size=min(count, snapshot_nodes), replace=False).tolist()
                body = json.dumps({"Pod": pod, "Nodes": None, "NodeNames": picked})
                row: dict[str, Any] = {"names": len(picked), "request_bytes": len(body)}
                for verb in ("filter", "prioritize"):
                    event = _event(f"/{verb}", body)
                    response = handler.lambda_handler(event, _Context())
                    assert response["statusCode"] == 200, response["body"][:300]
                    call = partial(handler.lambda_handler, event, _Context())
                    row[verb] = time_us(call, max(5, repeat // 4))
                # The same names for a pod with three peers (plus its own workload): the locality cost.
                peers_event = _event("/prioritize", json.dumps({"Pod": peered, "Nodes": None, "NodeNames": picked}))
                call = partial(handler.lambda_handler, peers_event, _Context())
                row["prioritize_with_peers"] = time_us(call, max(5, repeat // 4))
                reply = json.loads(handler.lambda_handler(_event("/filter", body), _Context())["body"])
                row["filter_feasible"] = len(reply["NodeNames"])
                row["fresh_names"] = _fresh_names(handler, all_names, len(picked), repeat, rng)
                results.append(row)
        snapshot_bytes = path.stat().st_size
    return {"snapshot_nodes": snapshot_nodes, "snapshot_bytes": snapshot_bytes, "by_names": results}


def _fresh_names(
    handler: Any, all_names: np.ndarray, count: int, repeat: int, rng: np.random.Generator
) -> dict[str, Any]:
    """Filter and prioritize where every request names other nodes for another pod (kube-scheduler's
    feasible nodes change from pod to pod, and its sampling rotates), so that nothing of the last
    request's lookup is reused, beside the floor: what msgspec takes to decode the same body and
    encode a names-only reply with as many names. Each path and the floor take turns, round by round,
    so that the machine's drift hits all of them; the ratios are p99 over p99.

    Through ``lambda_handler`` (the event and logs included) and through ``Extender.handle`` (the
    bytes in, the bytes out: what the issue's floor compares with)."""
    import msgspec

    bodies = [
        json.dumps({"Pod": make_pod(f"fresh-{i}", 1 + i % 2), "Nodes": None,
                    "NodeNames": rng.choice(all_names, size=count, replace=False).tolist()})
        for i in range(16)
    ]  # fmt: skip
    events = {verb: [_event(f"/{verb}", body) for body in bodies] for verb in ("filter", "prioritize")}
    raw = [body.encode() for body in bodies]
    decoder, encoder = msgspec.json.Decoder(), msgspec.json.Encoder()

    def floor(body: bytes) -> None:
        names = decoder.decode(body)["NodeNames"]
        encoder.encode({"Nodes": None, "NodeNames": names, "FailedNodes": {}, "FailedAndUnresolvableNodes": {},
                        "Error": ""})  # fmt: skip

    cases: dict[str, tuple[Any, list[Any]]] = {
        "msgspec_floor": (floor, raw),
        **{f"{verb}_handler": (lambda e: handler.lambda_handler(e, _Context()), events[verb]) for verb in events},
        **{f"{verb}_extender": (partial(handler.EXTENDER.handle, verb), raw) for verb in events},
    }
    samples: dict[str, list[float]] = {name: [] for name in cases}
    per_round = max(len(bodies), repeat // 10)
    for _round in range(10):
        for name, (call, inputs) in cases.items():
            for i in range(per_round):
                started = time.perf_counter_ns()
                call(inputs[i % len(inputs)])
                samples[name].append((time.perf_counter_ns() - started) / 1000)
    out: dict[str, Any] = {
        name: {"p50_us": round(float(np.percentile(v, 50)), 1), "p99_us": round(float(np.percentile(v, 99)), 1),
               "n": len(v)}
        for name, v in samples.items()
    }  # fmt: skip
    floor_p99 = out["msgspec_floor"]["p99_us"]
    paths = [name for name in cases if name != "msgspec_floor"]
    out["over_floor_p99"] = {name: round(out[name]["p99_us"] / floor_p99, 1) for name in paths}
    out["phases_p50_us"] = _phases(handler.EXTENDER, raw, repeat)
    return out


def _phases(extender: Any, bodies: list[bytes], repeat: int) -> dict[str, dict[str, float]]:
    """Where ``Extender.handle``'s time goes on those bodies, phase by phase (p50, microseconds): the
    request decoded; the names' rows found (their hashes, then the index); the view built (the rows
    found, the sub-table, free GPUs); the decision, which builds its own view; the reply written. Each
    phase runs as a pass over the rotating bodies, so that no call reuses the last one's names; ``both``
    holds the phases that filter and prioritize share."""
    from scheduler_core.extender.wire import ExtenderArgs

    args = [ExtenderArgs.decode(body) for body in bodies]
    demands = [extender.demand(a.pod) for a in args]
    table = extender.state().table
    rounds = max(2, repeat // (10 * len(bodies)))

    def p50(call: Any) -> float:
        samples = []
        for _round in range(rounds):
            for i in range(len(bodies)):
                started = time.perf_counter_ns()
                call(i)
                samples.append((time.perf_counter_ns() - started) / 1000)
        return round(float(np.median(samples)), 1)

    names = [a.node_names or [] for a in args]
    out: dict[str, dict[str, float]] = {
        "both": {
            "decode": p50(lambda i: ExtenderArgs.decode(bodies[i])),
            "hash_names": p50(lambda i: np.fromiter(map(hash, names[i]), np.int64, len(names[i]))),
            "find_rows": p50(lambda i: table.rows_of(names[i])),
        }
    }
    for verb in ("filter", "prioritize"):
        decide = getattr(extender, verb)
        outcomes = [decide(a) for a in args]
        assumed = verb == "prioritize"
        out[verb] = {
            "view": p50(lambda i, assumed=assumed: extender.view(args[i], demands[i], assumed=assumed)),
            "decision": p50(lambda i, decide=decide: decide(args[i])),
            "reply": p50(lambda i, outcomes=outcomes: outcomes[i].to_json()),
            "handle": p50(lambda i, verb=verb: extender.handle(verb, bodies[i])),
        }
    return out


_CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import lambdas.extender.handler as handler
t1 = time.perf_counter()
event = json.loads(sys.stdin.read())
class Ctx:
    function_name = "cold"; memory_limit_in_mb = 512; aws_request_id = "cold"
    invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:cold"
response = handler.lambda_handler(event, Ctx())
t2 = time.perf_counter()
assert response["statusCode"] == 200, response
assert json.loads(response["body"])["Error"] == "", response["body"][:300]
sys.stderr.write(json.dumps({"import_init_ms": 1000 * (t1 - t0), "first_request_ms": 1000 * (t2 - t1),
                             "kubernetes_imported": "kubernetes" in sys.modules}) + "\n")
"""


_RESTORE_CHILD = r"""
import json, os, sys, time
import snapshot_restore_py as hooks
import lambdas.extender.handler as handler
class Ctx:
    function_name = "restore"; memory_limit_in_mb = 1769; aws_request_id = "restore"
    invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:restore"
events = json.loads(sys.stdin.read())
started = time.perf_counter()
for func, args, kwargs in reversed(hooks.get_before_snapshot()):  # as Lambda runs them: last registered first
    func(*args, **kwargs)
before_ms = 1000 * (time.perf_counter() - started)
read, write = os.pipe()
child = os.fork()  # the snapshot: everything initialised so far is what the restored environment has
if child == 0:
    os.close(read)
    t0 = time.perf_counter()
    for func, args, kwargs in hooks.get_after_restore():
        func(*args, **kwargs)
    t1 = time.perf_counter()
    response = handler.lambda_handler(events[0], Ctx())
    t2 = time.perf_counter()
    ok = response["statusCode"] == 200 and json.loads(response["body"])["Error"] == ""
    warm, fresh = [], []
    for event in events[1:]:
        t = time.perf_counter()
        handler.lambda_handler(event, Ctx())
        (warm if event["body"].endswith(events[0]["body"][-200:]) else fresh).append(1000 * (time.perf_counter() - t))
    result = {"after_restore_ms": 1000 * (t1 - t0), "first_request_ms": 1000 * (t2 - t1), "warm_ms": warm,
              "warm_fresh_names_ms": fresh,
              "ok": ok, "before_snapshot_ms": before_ms, "hooks": len(hooks.get_after_restore())}
    os.write(write, json.dumps(result).encode())
    os._exit(0)
os.close(write)
data = b""
while chunk := os.read(read, 65536):
    data += chunk
os.waitpid(child, 0)
sys.stderr.write(data.decode() + "\n")
"""


def restore_stand_in(runs: int, snapshot_nodes: int, seed: int) -> dict[str, Any]:
    """SnapStart's restore, stood in for by a fork: a fresh interpreter imports and initialises the handler
    (the snapshot at ``SNAPSHOT_URI`` on moto's S3), runs the ``before_snapshot`` hooks as Lambda does, and
    forks; the child, the restored environment, runs the ``after_restore`` hooks and serves a first
    1,000-name filter (other names than the warm-up's), then 25 more for other pods over the same names
    (a burst, as kube-scheduler sends it, which reuses the names' lookup) and 25 over other names each.
    Reported: the first request, the warm ones' medians, and the ratios. The fork's copy-on-write stands
    in for a real restore's loading of the snapshot's pages on demand, which costs more
    (``docs/benchmarks.md#snapstart`` says how to measure it in an account)."""
    rng = np.random.default_rng(seed)
    with _moto_snapshot(snapshot_nodes, seed) as (env, snapshot):
        names = rng.choice(np.array(snapshot.table.names), size=min(1000, snapshot_nodes), replace=False).tolist()
        everyone = np.array(snapshot.table.names)
        lists = [names] * 26 + [rng.choice(everyone, size=len(names), replace=False).tolist() for _ in range(25)]
        events = [_event("/filter", json.dumps({"Pod": make_pod(f"p-{i}", 1), "NodeNames": listed}))
                  for i, listed in enumerate(lists)]  # fmt: skip
        samples = []
        for _ in range(runs):
            proc = subprocess.run(
                [sys.executable, "-c", _RESTORE_CHILD], input=json.dumps(events), env=env,
                capture_output=True, text=True, check=False,
            )  # fmt: skip
            if proc.returncode != 0 or not proc.stderr.strip():
                raise RuntimeError(f"restore stand-in failed: {proc.stderr[-2000:]}")
            child = json.loads(proc.stderr.strip().splitlines()[-1])
            if not child["ok"]:
                raise RuntimeError(f"the restored environment's first request failed: {child}")
            samples.append(child)
    first = [s["first_request_ms"] for s in samples]
    warm = [float(np.median(s["warm_ms"])) for s in samples]
    fresh = [float(np.median(s["warm_fresh_names_ms"])) for s in samples]
    ratios = [f / w for f, w in zip(first, warm, strict=True)]
    return {
        "benchmark": "restore-stand-in",
        "runs": runs,
        "snapshot_nodes": snapshot_nodes,
        "first_request_names": len(names),
        "hooks_registered": samples[0]["hooks"],
        "before_snapshot_ms": round(float(np.median([s["before_snapshot_ms"] for s in samples])), 1),
        "after_restore_ms": round(float(np.median([s["after_restore_ms"] for s in samples])), 1),
        "first_request_ms": [round(v, 2) for v in first],
        "warm_request_p50_ms": [round(v, 2) for v in warm],
        "first_over_warm": [round(v, 2) for v in ratios],
        "warm_request_fresh_names_p50_ms": [round(v, 2) for v in fresh],
        "first_over_warm_fresh_names": [round(f / w, 2) for f, w in zip(first, fresh, strict=True)],
    }


@contextlib.contextmanager
def _moto_snapshot(snapshot_nodes: int, seed: int) -> Any:
    """moto's S3 server on loopback holding a synthetic snapshot; yields the environment a child process
    needs to read it (``SNAPSHOT_URI``, the endpoint, credentials) and the snapshot."""
    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per moto request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        creds = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"}
        s3 = boto3.client(
            "s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="bench",
            aws_secret_access_key="bench",
        )  # fmt: skip
        s3.create_bucket(Bucket="state")
        snapshot = synthetic_snapshot(snapshot_nodes, np.random.default_rng(seed), generated_at=time.time())
        s3.put_object(Bucket="state", Key="snapshot.npz", Body=write_snapshot(snapshot))
        env = {
            "PATH": os.environ.get("PATH", ""),
            "SNAPSHOT_URI": "s3://state/snapshot.npz",
            "AWS_ENDPOINT_URL_S3": endpoint,
            **creds,
        }
        yield env, snapshot
    finally:
        server.stop()


def cold_start(runs: int, snapshot_nodes: int, seed: int) -> dict[str, Any]:
    with _moto_snapshot(snapshot_nodes, seed) as (env, snapshot):
        names = list(snapshot.table.names[: min(1000, snapshot_nodes)])
        event = _event("/filter", json.dumps({"Pod": make_pod("p", 1), "NodeNames": names}))
        samples = []
        for _ in range(runs):
            started = time.perf_counter()
            proc = subprocess.run(
                [sys.executable, "-c", _CHILD],
                input=json.dumps(event),
                env=env,
                capture_output=True,
                text=True,
                check=False,
            )
            wall_ms = 1000 * (time.perf_counter() - started)
            if proc.returncode != 0:
                raise RuntimeError(f"cold-start child failed: {proc.stderr[-2000:]}")
            child = json.loads(proc.stderr.strip().splitlines()[-1])
            samples.append({**child, "process_wall_ms": wall_ms})

    def stat(key: str) -> dict[str, float]:
        values = np.array([s[key] for s in samples])
        return {"p50": round(float(np.median(values)), 1), "max": round(float(values.max()), 1)}

    return {
        "benchmark": "cold-start",
        "runs": runs,
        "snapshot_nodes": snapshot_nodes,
        "first_request_names": len(names),
        "import_init_ms": stat("import_init_ms"),
        "first_request_ms": stat("first_request_ms"),
        "import_init_plus_first_request_ms": {
            "p50": round(float(np.median([s["import_init_ms"] + s["first_request_ms"] for s in samples])), 1)
        },
        "process_wall_ms": stat("process_wall_ms"),
        "kubernetes_imported": any(s["kubernetes_imported"] for s in samples),
    }
