"""Each Lambda's synthesized IAM policy is the one enforced (issue #42, DESIGN section 7 "Identities").

Each function's real AWS calls, made by its own service and adapter code the way its handler makes them,
run against moto's server with IAM authentication on, signed by a user that holds exactly the policy
documents the synthesized template gives the function's execution role, resolved to the resources
created in moto for the test. Then the same calls run once per action they need, with that one action
taken out of the policy: the call that needs it must be refused, and the function must notice.

- Kubernetes is the in-repo API double here: the e2e suite runs each function as its Kubernetes
  identity. The EKS side of connecting (``DescribeCluster``; the STS token is presigned locally, and
  ``sts:GetCallerIdentity`` needs no grant) runs for real.
- What moto cannot show, and the actions no code of the functions calls, are in :data:`NOT_EXERCISED`,
  each with its reason; ``testing/iam.py`` says how moto evaluates policies and what the harness adds.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields, replace
from typing import Any

import boto3
import pytest
from aws_lambda_powertools.utilities.parameters.constants import DEFAULT_PROVIDERS
from botocore.exceptions import ClientError

from adapters import kube as kube_adapter
from adapters.gpu_ledger import LedgerStore, LedgerStoreError, create_table
from adapters.kube import connect_url
from adapters.snapshot_store import SnapshotStoreError
from application.consolidation import service as consolidation
from application.consolidation.settings import ConsolidationSettings
from application.deletion_cost import service as deletion_cost
from application.deletion_cost.settings import DeletionCostSettings
from application.extender.service import build as build_extender
from application.extender.settings import ExtenderSettings
from application.node_state import service as node_state
from application.node_state.settings import NodeStateSettings
from cdk.functions import VPC_ACCESS_ACTIONS
from scheduler_core.errors import ClusterStateUnavailableError
from scheduler_core.extender.wire import ExtenderBindingArgs
from scheduler_core.k8s.names import ASSIGNED_GPUS_ANNOTATION
from scheduler_core.simulator.synthetic import CATALOGUE, ZONES, make_node, make_pod
from scheduler_core.state.ledger import Demand
from scheduler_core.state.snapshot import build_snapshot, read_snapshot, write_snapshot
from testing import iam
from testing.kube_double import KubeApiDouble

from .conftest import Synth

Synthesise = Callable[..., Synth]
REGION = iam.REGION
TOKEN = "kube-token"
SHAPES = {shape.model: shape for shape in CATALOGUE}
NOT_EXERCISED = {
    **dict.fromkeys(("logs:CreateLogStream", "logs:PutLogEvents"), "the Lambda service writes the function's "
                    "logs with the role; the code calls no CloudWatch Logs API"),
    **dict.fromkeys(("xray:PutTraceSegments", "xray:PutTelemetryRecords"), "the Lambda runtime's X-Ray "
                    "daemon sends the traces with the role; the code calls no X-Ray API"),
    **dict.fromkeys(VPC_ACCESS_ACTIONS, "the Lambda service attaches the function to the VPC with the role"),
    "sqs:SendMessage": "the Lambda service sends a failed asynchronous invocation to the dead-letter queue",
    "aps:QueryMetrics": "the AMP query is SigV4 over Prometheus' HTTP API, and moto has no AMP query API "
                        "(DESIGN section 8); tests/adapters/test_amp.py checks the query against a real Prometheus "
                        "and the SigV4 signing (service aps) on its own",
    "s3:ListBucket": "it only makes S3 answer 404 instead of 403 for a missing snapshot; moto answers 404 "
                     "either way and does not evaluate its s3:prefix condition (testing/iam.py)",
}  # fmt: skip
"""Actions in the functions' policies that no test here can show to be needed, and why."""


# ---- the deployment in moto ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Server:
    endpoint: str
    admin: iam.Keys


@pytest.fixture(scope="module")
def synthesised(synth: Synthesise) -> Synth:
    return synth(
        sharing=True, consolidation=True
    )  # every grant: the ledger's with sharing, the holds' with consolidation


@pytest.fixture(scope="module")
def server(synthesised: Synth) -> Iterator[Server]:
    with iam.iam_moto_server() as endpoint:
        admin = iam.bootstrap_admin(endpoint)
        admin.client("eks", endpoint).create_cluster(
            name=synthesised.stack.config.cluster_name,
            roleArn=f"arn:aws:iam::{iam.ACCOUNT}:role/eks-cluster",
            resourcesVpcConfig={"subnetIds": []},
        )
        yield Server(endpoint, admin)


def logical_id(synthesised: Synth, construct: Any) -> str:
    stack = synthesised.stack
    return str(stack.resolve(stack.get_logical_id(construct.node.default_child)))


@dataclass(frozen=True)
class Deployed:
    """This test's table, bucket and parameter in moto, and the template resolved to them."""

    server: Server
    synthesised: Synth
    deployment: iam.Deployment
    table: str
    bucket: str
    snapshot_key: str

    @property
    def template(self) -> dict[str, Any]:
        template: dict[str, Any] = self.synthesised.template.to_json()
        return template

    def policy(self, function: str) -> list[iam.Document]:
        role = getattr(self.synthesised.stack, function).role
        documents = iam.role_policies(self.template, logical_id(self.synthesised, role))
        resolved: list[iam.Document] = iam.resolve(documents, self.deployment)
        return resolved

    def environment(self, function: str, settings: type) -> dict[str, str]:
        """The function's environment in the template, resolved: the variables ``settings`` reads, less
        ``AMP_QUERY_URL`` (not in moto). Endpoint variables (``AWS_ENDPOINT_URL_*``) are the VPC's; the
        test's environment sends every SDK call to moto instead."""
        cfn = logical_id(self.synthesised, getattr(self.synthesised.stack, function).function)
        variables = self.template["Resources"][cfn]["Properties"]["Environment"]["Variables"]
        read = {f.metadata["env"] for f in fields(settings)} - {"AMP_QUERY_URL"}
        return {name: str(iam.resolve(value, self.deployment)) for name, value in variables.items() if name in read}

    def ledger(self) -> LedgerStore:
        """The ledger through the administrator (to set up what a test starts from)."""
        return LedgerStore(self.table, self.server.admin.client("dynamodb", self.server.endpoint))


_NUMBERS = itertools.count()


@pytest.fixture
def deployed(server: Server, synthesised: Synth) -> Deployed:
    """A table, a versioned bucket and the deletion-cost parameter of this test's own, as the stack
    declares them, made by the administrator; every other resource the policies or the environments name
    is one no code calls (:data:`testing.iam.INERT_TYPES`)."""
    number, admin, endpoint, stack = next(_NUMBERS), server.admin, server.endpoint, synthesised.stack
    template: dict[str, Any] = synthesised.template.to_json()
    table, bucket = f"gpu-ledger-{number}", f"gpu-snapshots-{number}"
    dynamodb = admin.client("dynamodb", endpoint)
    create_table(dynamodb, table)
    s3 = admin.client("s3", endpoint)
    s3.create_bucket(Bucket=bucket)
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    parameter_id = logical_id(synthesised, stack.node.find_child("DeletionCostConfig"))
    parameter = f"CFN-DeletionCostConfig-{number}"
    value = template["Resources"][parameter_id]["Properties"]["Value"]
    admin.client("ssm", endpoint).put_parameter(Name=parameter, Type="String", Value=value)
    resources: dict[str, dict[str, str]] = {
        logical_id(synthesised, stack.state.ledger): {
            "Ref": table, "Arn": dynamodb.describe_table(TableName=table)["Table"]["TableArn"]},
        logical_id(synthesised, stack.state.bucket): {"Ref": bucket, "Arn": f"arn:aws:s3:::{bucket}"},
        parameter_id: {"Ref": parameter},
    }  # fmt: skip
    named: set[str] = set()
    for function in FUNCTIONS:
        construct = getattr(stack, function.name)
        named |= iam.referenced(iam.role_policies(template, logical_id(synthesised, construct.role)))
        named |= iam.referenced(
            template["Resources"][logical_id(synthesised, construct.function)]["Properties"]["Environment"]
        )
    for other in named - set(resources):
        if template["Resources"][other]["Type"] in iam.INERT_TYPES:
            resources[other] = iam.inert_attributes(template, other)
    return Deployed(server, synthesised, iam.Deployment(resources), table, bucket, stack.state.snapshot_key)


@pytest.fixture
def api() -> Iterator[KubeApiDouble]:
    with KubeApiDouble(tokens=[TOKEN]) as double:
        yield double


# ---- each function's calls --------------------------------------------------------------------------------
def gpu_node(name: str, model: str, *, labelled: bool = True) -> dict[str, Any]:
    """A node; ``labelled=False``: no GFD nor project labels, so the refresher asks EC2 about its type."""
    return make_node(name, SHAPES[model], ZONES[0], gfd=labelled, project_labels=labelled)


def share_pod(name: str, milli: int, node: str | None = None, assigned: str | None = None) -> dict[str, Any]:
    pod = make_pod(name, 0, milli=milli, node_name=node, phase="Running" if node else "Pending")
    if assigned is not None:
        pod["metadata"]["annotations"][ASSIGNED_GPUS_ANNOTATION] = assigned
    return pod


def node_state_seed(deployed: Deployed, api: KubeApiDouble) -> None:
    """An A100 node nothing has labelled (its GPUs come from EC2), a T4 node with a share pod bound to it,
    and the T4's ledger item holding that pod and one that is gone (the reconcile frees it)."""
    api.load("nodes", [gpu_node("a100-0", "A100", labelled=False), gpu_node("t4-1", "T4")])
    api.load("pods", [share_pod("kept", 300, "t4-1", "0:300")])
    ledger = deployed.ledger()
    ledger.assign("t4-1", 4, "uid-default-kept", Demand(1, 300))
    ledger.assign("t4-1", 4, "uid-default-gone", Demand(1, 200))


def node_state_calls(deployed: Deployed, api: KubeApiDouble) -> list[str]:
    """One run as the handler makes it (``build_services`` and ``refresh``, with the ledger), the watch's
    release of a share whose pod was deleted, and the snapshot read back through the function's store."""
    settings = NodeStateSettings.from_env(
        deployed.environment("node_state", NodeStateSettings), region=REGION, watch_s=0.0
    )
    try:
        services = node_state.build_services(settings, boto3.session.Session(region_name=REGION))
    except ClientError as exc:  # DescribeCluster, at import in the handler
        return [f"connecting to the cluster: {exc}"]
    services.kube = connect_url(api.url, TOKEN)
    report = node_state.refresh(settings, services, time_left=lambda: 60.0)
    problems = [report.error] if report.status != "ok" else []
    problems += [report.ledger_error] if report.ledger_error else []
    problems += [f"nodes left unlabelled: {report.unlabelled}"] if report.unlabelled else []
    if not report.ledger_error and report.ledger_drift != {"released": 1}:
        problems.append(f"the reconcile found {report.ledger_drift}, expected the gone pod's share released")
    assert services.ledger is not None
    try:  # what the watch's on_gone does for a share pod seen deleted
        if not services.ledger.release("t4-1", 4, "uid-default-kept"):
            problems.append("the watch's release found no share to free")
    except LedgerStoreError as exc:
        problems.append(f"the watch's release: {exc}")
    try:
        fetched = services.store.fetch(None)
        if fetched is None or read_snapshot(fetched.data).table.n_nodes != 2:
            problems.append("the snapshot read back is not the one written")
    except SnapshotStoreError as exc:
        problems.append(f"reading the snapshot back: {exc}")
    return problems


BIND_NODES = [gpu_node("t4-0", "T4"), gpu_node("a100-1", "A100")]


def extender_seed(deployed: Deployed, api: KubeApiDouble) -> None:
    """The snapshot the node-state refresher would have written, and two pending share pods."""
    api.load("nodes", BIND_NODES)
    api.load("pods", [share_pod("a", 300), share_pod("b", 500)])
    snapshot = build_snapshot(BIND_NODES, [], cluster="gpu-prod", generated_at=time.time())
    s3 = deployed.server.admin.client("s3", deployed.server.endpoint)
    s3.put_object(Bucket=deployed.bucket, Key=deployed.snapshot_key, Body=write_snapshot(snapshot))


def extender_calls(deployed: Deployed, api: KubeApiDouble) -> list[str]:
    """The extender as its handler builds it (``application.extender.service.build``, boto3's default clients):
    the snapshot read, a bind (ledger read and conditional write), a bind whose Binding is refused (the
    rollback's release), preempt's holdings (BatchGetItem), the live state's release of a gone pod, and the
    connection the binder makes to the cluster (DescribeCluster)."""
    settings = ExtenderSettings.from_env(
        deployed.environment("extender", ExtenderSettings), kube_api_url=api.url, kube_token=TOKEN, region=REGION
    )
    service = build_extender(settings)
    assert service.source is not None and service.extender.accounting is not None
    try:
        service.source.current()
    except ClusterStateUnavailableError as exc:
        return [f"the snapshot: {exc}"]  # nothing is decided without it
    binder: Any = service.extender.accounting
    problems = []
    bound = binder.bind(ExtenderBindingArgs("a", "default", "uid-default-a", "t4-0"))
    problems += [bound.error] if bound.error else []
    api.fail_next("POST", r"/pods/b/binding", 403)
    refused = binder.bind(ExtenderBindingArgs("b", "default", "uid-default-b", "t4-0"))
    if not refused.rolled_back:
        problems.append(f"the refused bind was not rolled back: {refused.error}")
    try:
        held = binder.holdings(["t4-0", "a100-1"])
        if set(held.get("t4-0", {})) != {"uid-default-a"}:
            problems.append(f"preempt's holdings: {held}")
    except ClusterStateUnavailableError as exc:
        problems.append(f"preempt's holdings: {exc}")
    try:
        if not binder.release_pod("t4-0", "uid-default-a"):
            problems.append("the live state's release found no share to free")
    except LedgerStoreError as exc:
        problems.append(f"the live state's release: {exc}")
    try:  # what the binder's Kubernetes client factory does when deployed (CLUSTER_NAME, no KUBE_API_URL)
        replace(settings, kube_api_url="").connect(boto3.session.Session(region_name=REGION))
    except ClientError as exc:
        problems.append(f"connecting to the cluster: {exc}")
    return problems


def deletion_cost_calls(deployed: Deployed, api: KubeApiDouble) -> list[str]:
    """One run as the handler makes it: ``build_services`` (DescribeCluster) and ``refresh``, which reads
    the workload config from the SSM parameter through Powertools."""
    settings = DeletionCostSettings.from_env(
        deployed.environment("deletion_cost", DeletionCostSettings), region=REGION, passes=1
    )
    try:
        services = deletion_cost.build_services(settings, boto3.session.Session(region_name=REGION))
    except ClientError as exc:
        return [f"connecting to the cluster: {exc}"]
    services.kube = connect_url(api.url, TOKEN)
    report = deletion_cost.refresh(settings, services, time_left=lambda: 60.0)
    return [report.error] if report.status != "ok" else []


def consolidation_seed(deployed: Deployed, api: KubeApiDouble) -> None:
    """Two 8-GPU nodes, each holding a movable one-GPU pod, and a Pending 8-GPU pod: one move makes room."""
    from tests.scheduler_core.consolidation.conftest import gpu_node as plain_node
    from tests.scheduler_core.consolidation.conftest import gpu_pod

    api.load("nodes", [plain_node("a"), plain_node("b")])
    api.load("pods", [gpu_pod("a0", "a"), gpu_pod("b0", "b"), gpu_pod("big", gpus=8, owner="", pending=True)])


def consolidation_calls(deployed: Deployed, api: KubeApiDouble) -> list[str]:
    """One run as the handler makes it: ``build_services`` (DescribeCluster) and ``consolidate``, which
    reads the holds (none yet), writes them, evicts one pod and writes them again."""
    settings = ConsolidationSettings.from_env(
        deployed.environment("consolidation", ConsolidationSettings), region=REGION, settle_s=0.0
    )
    try:
        services = consolidation.build_services(settings, boto3.session.Session(region_name=REGION))
    except ClientError as exc:
        return [f"connecting to the cluster: {exc}"]
    services.kube = connect_url(api.url, TOKEN)
    report = consolidation.consolidate(settings, services, time_left=lambda: 60.0)
    problems = [report.error] if report.status != "ok" else []
    return problems + ([] if report.evictions == 1 or problems else [f"expected one eviction: {report}"])


@dataclass(frozen=True)
class Function:
    name: str  # the stack's attribute
    calls: frozenset[str]  # the actions of the AWS calls in its code (adapters/ and lambdas/<name>/)
    seed: Callable[[Deployed, KubeApiDouble], None]
    run: Callable[[Deployed, KubeApiDouble], list[str]]

    def __str__(self) -> str:
        return self.name


def _nothing(deployed: Deployed, api: KubeApiDouble) -> None:
    pass


FUNCTIONS = (
    Function(
        "node_state",
        frozenset({
            "eks:DescribeCluster",  # adapters/kube.py describe_cluster, in build_services
            "s3:GetObject",  # snapshot_store: HeadObject before a conditional write, GetObject to read
            "s3:PutObject",  # snapshot_store: the conditional PutObject
            "ec2:DescribeInstanceTypes",  # adapters/ec2_gpu.py, for nodes without GFD labels
            "dynamodb:Scan",  # gpu_ledger scan: the reconcile's view
            "dynamodb:PutItem",  # gpu_ledger write: the reconcile's and the release's conditional writes
            "dynamodb:GetItem",  # gpu_ledger read: the watch's release
        }),
        node_state_seed,
        node_state_calls,
    ),
    Function(
        "extender",
        frozenset({
            "s3:GetObject",  # the snapshot source
            "dynamodb:GetItem",  # gpu_ledger read: bind's assign, release
            "dynamodb:PutItem",  # gpu_ledger write: bind's assign, release
            "dynamodb:BatchGetItem",  # gpu_ledger read_many: preempt's holdings
            "eks:DescribeCluster",  # the binder's Kubernetes client
        }),
        extender_seed,
        extender_calls,
    ),
    Function(
        "deletion_cost",
        frozenset({"eks:DescribeCluster", "ssm:GetParameter"}),
        _nothing,
        deletion_cost_calls,
    ),
    Function(
        "consolidation",
        frozenset({
            "eks:DescribeCluster",  # adapters/kube.py describe_cluster, in build_services
            "s3:GetObject",  # adapters/holds_source.py read_book (a missing book reads as empty)
            "s3:PutObject",  # write_book: the holds before the evictions, and the evictions' times after
        }),
        consolidation_seed,
        consolidation_calls,
    ),
)  # fmt: skip


def run_as(
    documents: list[iam.Document], function: Function, deployed: Deployed, api: KubeApiDouble,
    monkeypatch: pytest.MonkeyPatch, user: str,
) -> tuple[list[str], iam.CallLog]:  # fmt: skip
    """``function``'s calls signed by a new user holding exactly ``documents``: the problems the function
    saw, and every call it made. The administrator sets up the state first, outside the log."""
    server = deployed.server
    keys = iam.create_user(server.endpoint, server.admin, iam.user_name(function.name, user), documents)
    function.seed(deployed, api)
    for name in iam.UNSET_ENV:
        monkeypatch.delenv(name, raising=False)
    for name, value in keys.env(server.endpoint).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)  # made anew, from this user's variables
    monkeypatch.setattr(kube_adapter, "_ENDPOINTS", {})  # DescribeCluster's answer is kept per process
    DEFAULT_PROVIDERS.clear()  # Powertools' SSM provider, its client and its 5-minute cache
    log = iam.CallLog()
    try:
        with log.recording():
            problems = function.run(deployed, api)
    finally:
        DEFAULT_PROVIDERS.clear()
    return problems, log


# ---- the tests ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("function", FUNCTIONS, ids=str)
def test_the_policy_grants_each_call_and_otherwise_only_what_lambda_does_with_the_role(
    deployed: Deployed, function: Function
) -> None:
    granted = iam.actions(deployed.policy(function.name))
    assert granted - set(NOT_EXERCISED) == function.calls
    assert all(len(reason) > 40 for reason in NOT_EXERCISED.values())


@pytest.mark.parametrize("function", FUNCTIONS, ids=str)
def test_each_functions_real_calls_pass_under_only_its_synthesized_policy(
    deployed: Deployed, api: KubeApiDouble, function: Function, monkeypatch: pytest.MonkeyPatch
) -> None:
    problems, log = run_as(deployed.policy(function.name), function, deployed, api, monkeypatch, "full")
    assert problems == []
    assert log.denied() == set()
    # What the code called is the list the removals below go through: a new call must join it.
    assert log.actions() == function.calls


@pytest.mark.parametrize(
    ("function", "action"),
    [(function, action) for function in FUNCTIONS for action in sorted(function.calls)],
    ids=lambda value: str(value),
)
def test_removing_an_action_a_call_needs_makes_that_call_fail(
    deployed: Deployed, api: KubeApiDouble, function: Function, action: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    documents = iam.without_action(deployed.policy(function.name), action)
    problems, log = run_as(documents, function, deployed, api, monkeypatch, f"without-{action}")
    assert action in log.denied(), log.calls
    assert log.denied() <= {action}  # only the removed action is refused: the rest of the policy still holds
    assert problems, f"{function}: the refused {action} went unnoticed"


def test_a_user_holding_no_policy_is_refused_and_a_forged_key_is_not_let_in(server: Server, deployed: Deployed) -> None:
    """The server really checks: a user without a policy is refused, and unknown keys are rejected."""
    nobody = iam.create_user(server.endpoint, server.admin, iam.user_name("nobody", str(deployed.table)), [])
    with pytest.raises(ClientError, match="not authorized to perform: dynamodb:Scan"):
        nobody.client("dynamodb", server.endpoint).scan(TableName=deployed.table)
    forged = iam.Keys("forged", "AKIAFORGEDFORGED0000", "forged")
    with pytest.raises(ClientError, match="InvalidClientTokenId"):
        forged.client("dynamodb", server.endpoint).scan(TableName=deployed.table)


def test_a_statement_on_another_table_does_not_grant_this_one(server: Server, deployed: Deployed) -> None:
    """Resources are enforced, not only actions (the harness gives moto each DynamoDB request's table)."""
    arn = deployed.deployment.attribute(
        logical_id(deployed.synthesised, deployed.synthesised.stack.state.ledger), "Arn"
    )

    def scan_on(resource: str) -> iam.Document:
        return {"Version": "2012-10-17",
                "Statement": [{"Effect": "Allow", "Action": "dynamodb:Scan", "Resource": resource}]}  # fmt: skip

    other = scan_on(arn.replace(f"table/{deployed.table}", "table/another-table"))
    user = iam.create_user(server.endpoint, server.admin, iam.user_name("other-table", deployed.table), [other])
    with pytest.raises(ClientError, match="not authorized to perform: dynamodb:Scan"):
        user.client("dynamodb", server.endpoint).scan(TableName=deployed.table)
    this = scan_on(arn)
    allowed = iam.create_user(server.endpoint, server.admin, iam.user_name("this-table", deployed.table), [this])
    assert allowed.client("dynamodb", server.endpoint).scan(TableName=deployed.table)["Items"] == []


def test_the_harness_invents_no_resource_the_code_may_call(deployed: Deployed) -> None:
    """Only logs, queues and AMP workspaces get made-up ARNs; anything else must exist in moto."""
    ledger = logical_id(deployed.synthesised, deployed.synthesised.stack.state.ledger)
    with pytest.raises(iam.UnresolvedError, match="create it in moto"):
        iam.inert_attributes(deployed.template, ledger)
    with pytest.raises(iam.UnresolvedError, match="no such resource"):
        iam.resolve({"Fn::GetAtt": ["NotDeployed", "Arn"]}, deployed.deployment)
    with pytest.raises(ValueError, match="not granted"):
        iam.without_action(deployed.policy("deletion_cost"), "dynamodb:GetItem")
