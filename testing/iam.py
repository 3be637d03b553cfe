"""Each Lambda's synthesized IAM policy, enforced by moto (DESIGN section 7, "Identities").

The pieces, in the order a test uses them:

- :func:`iam_moto_server`: moto's server (:func:`testing.moto.moto_server`) with IAM authentication on
  from the first request, and with :func:`resource_checks` installed in it (see below);
- :func:`bootstrap_admin`: the one administrator, made in a window of three unauthenticated requests that
  moto's ``/moto-api/reset-auth`` opens; it creates the fixtures (table, bucket, parameter, cluster) and
  the users, and nothing else;
- :func:`role_policies`: the policy documents a function's execution role holds in the synthesized
  template (its inline ``Policies`` and the ``AWS::IAM::Policy`` resources attached to it);
- :func:`resolve`: CloudFormation intrinsics (``Ref``, ``Fn::GetAtt``, ``Fn::Join``, ``Fn::Sub``,
  ``Fn::Select``, ``Fn::Split``, the pseudo-parameters) turned into the names and ARNs of what the test
  created in moto (:class:`Deployment`);
- :func:`create_user`: an IAM user holding exactly those documents, as inline user policies, and its keys;
- :func:`without_action`: the same documents less one action, to show that a call then fails;
- :class:`CallLog`: every AWS call the process makes, with the IAM action it needs and how it ended.

What moto's IAM checks cover (moto 5.2.5, ``moto/core/authorization.py`` and ``moto/iam/access_control.py``):

- an IAM user's own inline and attached policies, and those of its groups; no resource-based policies
  (the snapshot bucket's TLS-only bucket policy is not evaluated), no permission boundaries, no SCPs;
- the action, as ``<signing name>:<operation>``; S3 names its actions from the method (``HeadObject`` is
  ``s3:GetObject``) and checks the object's or the bucket's ARN;
- every other service is checked against the resource ``"*"`` only, unless its handler defines
  ``_determine_resource`` (IAM, STS and SQS do). A statement scoped to a table's ARN then matches nothing
  and every call is denied. :func:`resource_checks` gives moto the ARN of each request for exactly the
  operations the functions make (DynamoDB ``GetItem``, ``PutItem``, ``Scan``, ``BatchGetItem``; EKS
  ``DescribeCluster``; SSM ``GetParameter``), so that the policy's own resources are enforced, unchanged;
- ``Resource`` and ``Action`` patterns: ``*`` as a wildcard, matched whole; ``?`` is not supported;
- ``Condition``: ``StringEquals`` only, and a key the request does not supply is treated as satisfied. The
  one condition in the functions' policies, ``s3:prefix`` on ``s3:ListBucket``, is therefore not enforced;
  nor does moto answer 403 instead of 404 for a missing object when ``s3:ListBucket`` is not granted, which
  is what that statement is for. The tests account for it in the list of actions they do not exercise;
- ``sts:GetCallerIdentity`` is always allowed, as in AWS;
- signatures: moto recomputes a request's signature over its body or, when the body is empty, over its
  parsed parameters, which for a GET without a query string are its headers, so every signed EKS
  ``DescribeCluster`` fails with SignatureDoesNotMatch. :func:`resource_checks` has EKS requests without a
  body checked over the empty body that was signed. A presigned URL (the EKS token: STS
  ``GetCallerIdentity``) cannot be checked at all: moto's check needs an ``Authorization`` header and
  answers 500. The functions only presign it, locally; the cluster's authenticator makes the call, which
  needs no grant.
"""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from testing.moto import moto_server

ACCOUNT = "123456789012"
"""moto's default account (``moto.core.DEFAULT_ACCOUNT_ID``): the account of every request and ARN."""
REGION = "us-east-1"
PARTITION = "aws"

Document = dict[str, Any]
"""An IAM policy document, ``{"Version": ..., "Statement": [...]}``."""


class UnresolvedError(ValueError):
    """The template says something :func:`resolve` cannot turn into a value (an unknown resource, attribute
    or intrinsic)."""


# ---- the server --------------------------------------------------------------------------------------
@contextmanager
def iam_moto_server() -> Iterator[str]:
    """moto's server with IAM authentication on from the first request and :func:`resource_checks`
    installed; yields its URL. Nothing is allowed until :func:`bootstrap_admin` has made the administrator."""
    with moto_server(enforce_iam=True, setup=f"{__name__}:resource_checks") as url:
        yield url


@dataclass(frozen=True)
class Keys:
    """An IAM user's access key in moto's server."""

    user: str
    access_key_id: str
    secret_access_key: str

    def session(self, region: str = REGION) -> Any:
        """A boto3 session signing with these keys (endpoints from the environment, see :meth:`env`)."""
        import boto3

        return boto3.session.Session(
            aws_access_key_id=self.access_key_id, aws_secret_access_key=self.secret_access_key, region_name=region
        )

    def client(self, service: str, endpoint: str, region: str = REGION) -> Any:
        return self.session(region).client(service, endpoint_url=endpoint)

    def env(self, endpoint: str, region: str = REGION) -> dict[str, str]:
        """The variables that make every SDK client the process creates sign as this user and call moto:
        boto3's default session, new sessions, and Powertools' parameter providers alike."""
        return {"AWS_ACCESS_KEY_ID": self.access_key_id, "AWS_SECRET_ACCESS_KEY": self.secret_access_key,
                "AWS_REGION": region, "AWS_DEFAULT_REGION": region, "AWS_ENDPOINT_URL": endpoint}  # fmt: skip


UNSET_ENV = ("AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_PROFILE", "AWS_CONFIG_FILE",
             "AWS_SHARED_CREDENTIALS_FILE")  # fmt: skip
"""Variables to clear beside :meth:`Keys.env`: a session token would make moto look for an assumed role."""

ADMIN_POLICY: Document = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}


def bootstrap_admin(endpoint: str, name: str = "fixtures-admin") -> Keys:
    """Make the administrator that creates the fixtures and the users.

    The server checks every request from the first; ``/moto-api/reset-auth`` lets the next three through
    unchecked (moto counts them), which are exactly the three that make this user: CreateUser,
    PutUserPolicy, CreateAccessKey. Everything after them is checked again.
    """
    request = urllib.request.Request(
        f"{endpoint}/moto-api/reset-auth", data=b"3", method="POST", headers={"Content-Type": "text/plain"}
    )
    urllib.request.urlopen(request, timeout=10).close()
    import boto3

    iam = boto3.client("iam", endpoint_url=endpoint, region_name=REGION,
                       aws_access_key_id="bootstrap", aws_secret_access_key="bootstrap")  # fmt: skip
    iam.create_user(UserName=name)
    iam.put_user_policy(UserName=name, PolicyName="admin", PolicyDocument=json.dumps(ADMIN_POLICY))
    key = iam.create_access_key(UserName=name)["AccessKey"]
    return Keys(name, key["AccessKeyId"], key["SecretAccessKey"])


def create_user(endpoint: str, admin: Keys, name: str, documents: Sequence[Document]) -> Keys:
    """An IAM user holding exactly ``documents`` (one inline user policy each), and its access key."""
    iam = admin.client("iam", endpoint)
    iam.create_user(UserName=name)
    for number, document in enumerate(documents):
        iam.put_user_policy(UserName=name, PolicyName=f"policy-{number}", PolicyDocument=json.dumps(document))
    key = iam.create_access_key(UserName=name)["AccessKey"]
    return Keys(name, key["AccessKeyId"], key["SecretAccessKey"])


def user_name(*parts: str) -> str:
    """An IAM user name from ``parts`` (IAM allows letters, digits and ``+=,.@_-``, 64 characters)."""
    return re.sub(r"[^\w+=,.@-]", "-", "-".join(parts))[:64]


# ---- the template ------------------------------------------------------------------------------------
def role_policies(template: Mapping[str, Any], role_id: str) -> list[Document]:
    """The policy documents role ``role_id`` holds in ``template``, intrinsics unresolved: its inline
    ``Policies`` and every ``AWS::IAM::Policy`` or ``AWS::IAM::ManagedPolicy`` that lists it in ``Roles``.

    Raises
    ------
    UnresolvedError
        The role has ``ManagedPolicyArns``: an AWS managed policy's document is not in the template, so
        it cannot be given to a user here. (The functions' roles have none: the log, X-Ray and ENI actions
        that ``AWSLambdaBasicExecutionRole`` and ``AWSLambdaVPCAccessExecutionRole`` would grant are in
        their own policy, scoped, and the functions' code calls none of them: the Lambda service does.)
    """
    resources = template["Resources"]
    role = resources[role_id]
    if role["Type"] != "AWS::IAM::Role":
        raise UnresolvedError(f"{role_id}: expected an AWS::IAM::Role, got {role['Type']}")
    if role["Properties"].get("ManagedPolicyArns"):
        raise UnresolvedError(
            f"{role_id} has managed policies {role['Properties']['ManagedPolicyArns']}: their documents are not "
            "in the template"
        )
    documents = [dict(p["PolicyDocument"]) for p in role["Properties"].get("Policies", [])]
    for resource in resources.values():
        attached = {"Ref": role_id} in resource.get("Properties", {}).get("Roles", [])
        if resource["Type"] in ("AWS::IAM::Policy", "AWS::IAM::ManagedPolicy") and attached:
            documents.append(dict(resource["Properties"]["PolicyDocument"]))
    return documents


def actions(documents: Sequence[Document]) -> set[str]:
    """Every action allowed in ``documents``."""
    found: set[str] = set()
    for statement in _statements(documents):
        if statement["Effect"] == "Allow":
            found.update(_as_list(statement["Action"]))
    return found


def without_action(documents: Sequence[Document], action: str) -> list[Document]:
    """``documents`` less ``action`` in every statement (a statement left with no action goes).

    Raises
    ------
    ValueError
        No statement grants ``action``: removing it would prove nothing.
    """
    if action not in actions(documents):
        raise ValueError(f"{action}: not granted by the policy, so there is nothing to remove")
    result = []
    for document in documents:
        statements = []
        for statement in document["Statement"]:
            kept = [a for a in _as_list(statement["Action"]) if a != action]
            if kept:
                statements.append({**statement, "Action": kept if len(kept) > 1 else kept[0]})
        result.append({**document, "Statement": statements})
    return result


def referenced(value: Any) -> set[str]:
    """The logical IDs ``value`` refers to (``Ref``, ``Fn::GetAtt``, ``${X}`` in ``Fn::Sub``), pseudo-
    parameters left out."""
    found: set[str] = set()
    if isinstance(value, list):
        for item in value:
            found |= referenced(item)
    elif isinstance(value, dict):
        if set(value) == {"Ref"}:
            return set() if str(value["Ref"]).startswith("AWS::") else {str(value["Ref"])}
        if set(value) == {"Fn::GetAtt"}:
            target = value["Fn::GetAtt"]
            return {str(target[0] if isinstance(target, list) else target.split(".", 1)[0])}
        if set(value) == {"Fn::Sub"}:
            text, variables = (value["Fn::Sub"], {}) if isinstance(value["Fn::Sub"], str) else value["Fn::Sub"]
            names = {m.split(".", 1)[0] for m in re.findall(r"\$\{([^!}][^}]*)\}", text)} - set(variables)
            return {n for n in names if not n.startswith("AWS::")} | referenced(list(variables.values()))
        for item in value.values():
            found |= referenced(item)
    return found


@dataclass(frozen=True)
class Deployment:
    """What the template's resources are in moto: ``resources[logical_id]`` maps ``"Ref"`` and each
    attribute (``"Arn"``, ...) to its value."""

    resources: Mapping[str, Mapping[str, str]]
    account: str = ACCOUNT
    region: str = REGION
    partition: str = PARTITION

    def pseudo(self, name: str) -> str:
        values = {"AWS::AccountId": self.account, "AWS::Region": self.region, "AWS::Partition": self.partition,
                  "AWS::URLSuffix": "amazonaws.com"}  # fmt: skip
        if name not in values:
            raise UnresolvedError(f"pseudo-parameter {name}: not modelled")
        return values[name]

    def attribute(self, logical_id: str, attribute: str) -> str:
        if logical_id.startswith("AWS::") and attribute == "Ref":
            return self.pseudo(logical_id)
        if logical_id not in self.resources:
            raise UnresolvedError(f"{logical_id}: no such resource in the deployment ({sorted(self.resources)})")
        values = self.resources[logical_id]
        if attribute not in values:
            raise UnresolvedError(f"{logical_id}.{attribute}: not given (only {sorted(values)})")
        return values[attribute]


def resolve(value: Any, deployment: Deployment) -> Any:
    """``value`` from the template with every intrinsic replaced by what it is in ``deployment``.

    >>> d = Deployment({"Table": {"Ref": "ledger", "Arn": "arn:aws:dynamodb:us-east-1:1:table/ledger"}})
    >>> resolve({"Fn::Join": ["", ["arn:", {"Ref": "AWS::Partition"}, ":s3:::b/", {"Ref": "Table"}]]}, d)
    'arn:aws:s3:::b/ledger'
    >>> resolve({"Fn::Sub": "${Table.Arn}/index/*"}, d)
    'arn:aws:dynamodb:us-east-1:1:table/ledger/index/*'
    """
    if isinstance(value, list):
        return [resolve(item, deployment) for item in value]
    if not isinstance(value, dict):
        return value
    if len(value) == 1:
        ((key, argument),) = value.items()
        if key == "Ref":
            return deployment.attribute(str(argument), "Ref")
        if key == "Fn::GetAtt":
            logical_id, attribute = argument if isinstance(argument, list) else argument.split(".", 1)
            return deployment.attribute(logical_id, attribute)
        if key == "Fn::Join":
            separator, parts = argument
            return str(separator).join(str(part) for part in _flat(resolve(parts, deployment)))
        if key == "Fn::Sub":
            return _sub(argument, deployment)
        if key == "Fn::Select":
            index, items = argument
            return resolve(items, deployment)[int(resolve(index, deployment))]
        if key == "Fn::Split":
            separator, text = argument
            return str(resolve(text, deployment)).split(separator)
        if key.startswith("Fn::") or key == "Condition":
            raise UnresolvedError(f"{key}: not modelled")
    return {k: resolve(v, deployment) for k, v in value.items()}


def _sub(argument: Any, deployment: Deployment) -> str:
    text, variables = (argument, {}) if isinstance(argument, str) else argument
    values = {name: str(resolve(v, deployment)) for name, v in variables.items()}

    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        if name.startswith("!"):
            return "${" + name[1:] + "}"  # ${!Literal} is written as ${Literal}
        if name in values:
            return values[name]
        if name.startswith("AWS::"):
            return deployment.pseudo(name)
        logical_id, _, attribute = name.partition(".")
        return deployment.attribute(logical_id, attribute or "Ref")

    return re.sub(r"\$\{([^}]+)\}", one, text)


def _flat(items: Any) -> Iterator[Any]:
    for item in items:
        if isinstance(item, list):
            yield from _flat(item)
        else:
            yield item


INERT_TYPES = ("AWS::Logs::LogGroup", "AWS::SQS::Queue", "AWS::APS::Workspace")
"""Resources the functions' policies name but their code never calls, so none is created in moto: the
Lambda service writes the logs and sends to the dead-letter queue, and moto has no AMP query API (DESIGN
section 8). An ARN of the right shape stands for each (:func:`inert_attributes`)."""


def inert_attributes(template: Mapping[str, Any], logical_id: str, account: str = ACCOUNT,
                     region: str = REGION, partition: str = PARTITION) -> dict[str, str]:  # fmt: skip
    """``Ref`` and attributes for a resource of one of :data:`INERT_TYPES`, named after its logical ID.

    Raises
    ------
    UnresolvedError
        Any other type: a resource the code may call must be created in moto, not invented.
    """
    kind = template["Resources"][logical_id]["Type"]
    prefix = f"arn:{partition}"
    if kind == "AWS::Logs::LogGroup":
        name = f"/aws/lambda/{logical_id}"
        return {"Ref": name, "Arn": f"{prefix}:logs:{region}:{account}:log-group:{name}:*"}
    if kind == "AWS::SQS::Queue":
        url = f"https://sqs.{region}.amazonaws.com/{account}/{logical_id}"
        arn = f"{prefix}:sqs:{region}:{account}:{logical_id}"
        return {"Ref": url, "Arn": arn, "QueueName": logical_id, "QueueUrl": url}
    if kind == "AWS::APS::Workspace":
        workspace = f"ws-{logical_id.lower()[:20]}"
        arn = f"{prefix}:aps:{region}:{account}:workspace/{workspace}"
        return {"Ref": arn, "Arn": arn, "WorkspaceId": workspace}
    raise UnresolvedError(f"{logical_id} ({kind}): not one of {INERT_TYPES}; create it in moto instead")


def _statements(documents: Sequence[Document]) -> Iterator[dict[str, Any]]:
    for document in documents:
        yield from _as_list(document["Statement"])


def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list) else [value]


# ---- the calls ---------------------------------------------------------------------------------------
ACTION_OF_OPERATION = {("s3", "HeadObject"): "GetObject"}
"""Operations whose IAM action is not named after them (S3 authorises HeadObject as s3:GetObject)."""
DENIED_CODES = frozenset({"AccessDenied", "AccessDeniedException", "UnauthorizedOperation"})


@dataclass(frozen=True)
class Call:
    action: str  # the IAM action, e.g. "dynamodb:GetItem"
    error: str  # the error code, "" when the call succeeded
    message: str = ""

    @property
    def denied(self) -> bool:
        """Refused by IAM. moto answers JSON services with an XML error body that botocore reads as code
        ``403`` with the XML as the message; a refused HEAD has no body at all (``403 Forbidden``)."""
        return (
            self.error in DENIED_CODES
            or "<Code>AccessDenied</Code>" in self.message
            or (self.error == "403" and self.message == "Forbidden")
        )


@dataclass
class CallLog:
    """Every AWS API call made by the process while :meth:`recording`, with its IAM action and error code.
    Recorded below every client (boto3's default session, Powertools' providers, paginators, waiters), so
    that what the product's code swallows still shows."""

    calls: list[Call] = field(default_factory=list)

    @contextmanager
    def recording(self) -> Iterator[CallLog]:
        from botocore.client import BaseClient
        from botocore.exceptions import ClientError

        original: Callable[..., Any] = BaseClient._make_api_call
        log = self

        def make_api_call(client: Any, operation: str, params: Any) -> Any:
            service = client.meta.service_model.signing_name
            action = f"{service}:{ACTION_OF_OPERATION.get((service, operation), operation)}"
            try:
                result = original(client, operation, params)
            except ClientError as exc:
                error = exc.response.get("Error", {})
                log.calls.append(Call(action, str(error.get("Code", "")), str(error.get("Message", ""))))
                raise
            log.calls.append(Call(action, ""))
            return result

        BaseClient._make_api_call = make_api_call
        try:
            yield self
        finally:
            BaseClient._make_api_call = original

    def actions(self) -> set[str]:
        return {call.action for call in self.calls}

    def denied(self) -> set[str]:
        return {call.action for call in self.calls if call.denied}


# ---- in moto's server process --------------------------------------------------------------------------
def resource_checks() -> None:
    """Make moto check the functions' DynamoDB, EKS and SSM calls against the ARN they act on.

    moto checks those services' actions against the resource ``"*"`` (``BaseResponse.call_action``), and a
    statement whose ``Resource`` is the table's ARN matches nothing then. For the operations listed here,
    each ARN the request acts on is checked in turn (BatchGetItem's one per table, as AWS does); every
    other operation keeps moto's own check. Runs in the server's process
    (:func:`testing.moto.moto_server`'s ``setup``).
    """
    from moto.dynamodb.responses import DynamoHandler
    from moto.eks.responses import EKSResponse
    from moto.ssm.responses import SimpleSystemManagerResponse

    _check_each(DynamoHandler, _dynamodb_arns)
    _check_each(EKSResponse, _eks_arns, empty_body_signed=True)
    _check_each(SimpleSystemManagerResponse, _ssm_arns)


def _check_each(handler: type, arns: Callable[[Any, str], list[str]], *, empty_body_signed: bool = False) -> None:
    """``empty_body_signed``: moto recomputes a request's signature over its body or, when the body is
    empty, over its parsed parameters, which for a GET without a query string are the request's headers.
    Every signed EKS GET (DescribeCluster) then fails with SignatureDoesNotMatch. For this handler the
    signature of a request without a body is checked over the empty body that was signed."""
    check = handler._authenticate_and_authorize_normal_action  # type: ignore[attr-defined]

    def authorize(self: Any, resource: str = "*") -> None:
        from moto.utilities.utils import get_partition

        prefix = f"arn:{get_partition(self.region)}"
        data = self.data
        if empty_body_signed and not self.raw_body:
            self.data = {}
        try:
            for arn in arns(self, f"{prefix}:{{service}}:{self.region}:{self.current_account}") or [resource]:
                check(self, arn)
        finally:
            self.data = data

    handler._authenticate_and_authorize_normal_action = authorize  # type: ignore[attr-defined]


def _dynamodb_arns(response: Any, base: str) -> list[str]:
    action, arn = response._get_action(), base.format(service="dynamodb") + ":table/{}"
    if action in ("GetItem", "PutItem", "Scan"):
        return [arn.format(response._get_param("TableName"))]
    if action == "BatchGetItem":
        return [arn.format(table) for table in response._get_param("RequestItems") or {}]
    return []


def _eks_arns(response: Any, base: str) -> list[str]:
    if response._get_action() == "DescribeCluster":
        return [base.format(service="eks") + f":cluster/{response._get_param('name')}"]
    return []


def _ssm_arns(response: Any, base: str) -> list[str]:
    if response._get_action() == "GetParameter":
        name = str(response._get_param("Name"))
        # A name with a leading slash is a path: its ARN has one slash, parameter/a/b, not parameter//a/b.
        return [name if name.startswith("arn:") else base.format(service="ssm") + f":parameter/{name.lstrip('/')}"]
    return []
