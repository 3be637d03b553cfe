"""``gpu-scheduler ledger create|show``: the GPU ledger's DynamoDB table, for local runs.

boto3 finds the endpoint the usual way: ``AWS_ENDPOINT_URL_DYNAMODB`` (or ``AWS_ENDPOINT_URL``) points
it at a local DynamoDB, moto's server for example; the region comes from ``AWS_REGION`` or
``AWS_DEFAULT_REGION``.
"""

from __future__ import annotations

import argparse
import json
import os

from gpu_scheduler.commands.common import UsageError

HELP = "create or show the GPU ledger's DynamoDB table (honours AWS_ENDPOINT_URL_DYNAMODB)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    action = parser.add_subparsers(dest="action", required=True)
    create = action.add_parser("create", help="create the table (on-demand billing) and wait until it is active")
    create.add_argument("--table", required=True)
    show = action.add_parser("show", help="print every node's item as JSON: GPUs used and assignments by pod UID")
    show.add_argument("--table", required=True)


def run(args: argparse.Namespace) -> int:
    import boto3

    from adapters.gpu_ledger import LedgerStore, LedgerStoreError, create_table

    if not (os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")):
        raise UsageError("no AWS region: set AWS_REGION (and AWS_ENDPOINT_URL_DYNAMODB for a local DynamoDB)")
    client = boto3.client("dynamodb")
    try:
        if args.action == "create":
            created = create_table(client, args.table)
            print(json.dumps({"table": args.table, "created": created}))
            return 0
        items = LedgerStore(args.table, client).scan()
    except LedgerStoreError as exc:
        raise UsageError(str(exc)) from exc
    for item in sorted(items, key=lambda i: i.node):
        assignments = {uid: [list(pair) for pair in pairs] for uid, pairs in item.assignments.items()}
        print(json.dumps({"node": item.node, "version": item.version, "used": list(item.used),
                          "assignments": assignments}))  # fmt: skip
    return 0
