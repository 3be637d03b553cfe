"""CDK entry point: ``make synth`` (or ``cdk synth``) runs this.

It reads context (``cdk.json``, then ``-c key=value`` arguments or the CDK CLI's ``CDK_CONTEXT_JSON``),
creates the stack, runs cdk-nag's AwsSolutions checks through the v3 ``Validations`` API, synthesises to
``cdk.out`` (or ``CDK_OUTDIR``) and writes ``cdk.out/manifests/gpu-scheduler.yaml``.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `python cdk/app.py` puts cdk/ first on the path, not the repository
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

import aws_cdk as cdk  # noqa: E402
import cdk_nag  # noqa: E402

from cdk.config import DeployConfig  # noqa: E402
from cdk.grafana import DASHBOARDS, render  # noqa: E402
from cdk.lambda_code import LambdaPackage  # noqa: E402
from cdk.prometheus import rule_groups, scrape_configuration  # noqa: E402
from cdk.stack import GpuSchedulerStack  # noqa: E402
from manifests.scheduler import dump_yaml, render_yaml  # noqa: E402
from scheduler_core.errors import ConfigError  # noqa: E402

STACK_NAME = "GpuScheduler"
MANIFEST_HEADER = """eks-gpu-scheduler: RBAC and admission policies for the Lambdas' groups, and the second
kube-scheduler. Written by `make synth`. urlPrefix is the deployed API's endpoint-specific URL, and the
SecurityGroupPolicy's group the one the stack makes for the scheduler pods; before the first deploy they are
placeholders: fill them from the stack outputs ExtenderUrl and SchedulerSecurityGroupId, or run the stack
output SchedulerConfigCommand."""
# What the manifests carry for the API's URL before the first deploy: the endpoint-specific hostname's shape.
URL_PLACEHOLDER = "https://API_ID-VPCE_ID.execute-api.REGION.amazonaws.com/v1"
SECURITY_GROUP_PLACEHOLDER = "SCHEDULER_SECURITY_GROUP_ID"
"""The scheduler pods' security group in the manifests when the stack makes it (its ID is known after deploy)."""


def read_context(argv: Sequence[str], environ: Mapping[str, str]) -> dict[str, Any]:
    """cdk.json's context, then CDK_CONTEXT_JSON, then ``-c key=value`` arguments (the last wins)."""
    context: dict[str, Any] = {}
    cdk_json = ROOT / "cdk.json"
    if cdk_json.is_file():
        context.update(json.loads(cdk_json.read_text()).get("context", {}))
    if environ.get("CDK_CONTEXT_JSON"):
        context.update(json.loads(environ["CDK_CONTEXT_JSON"]))
    args = list(argv)
    for flag, value in itertools.pairwise(args):
        if flag in ("-c", "--context"):
            key, sep, text = value.partition("=")
            if not sep:
                raise ConfigError(f"{flag} {value!r}: expected key=value")
            context[key] = text
    return context


def build_app(context: Mapping[str, Any], outdir: str | None = None) -> tuple[cdk.App, GpuSchedulerStack]:
    """The app with its one stack and cdk-nag attached; nothing is synthesised yet."""
    config = DeployConfig.from_context(context)
    package_dir = Path(config.package_dir)
    package = LambdaPackage.load(
        package_dir if package_dir.is_absolute() else ROOT / package_dir, config.lambda_architecture
    )
    app = cdk.App(context=dict(context), outdir=outdir)
    stack = GpuSchedulerStack(
        app,
        STACK_NAME,
        config=config,
        package=package,
        description="eks-gpu-scheduler: private extender API, refreshers, state and cluster access",
    )
    cdk.Validations.of(app).add_plugins(cdk_nag.AwsSolutionsChecks(app))
    return app, stack


def write_manifests(stack: GpuSchedulerStack, outdir: Path) -> Path:
    """The manifests with the API URL, and a security group the stack makes, as placeholders (they are only
    known after deploy)."""
    text = json.dumps(stack.manifests).replace(stack.api.url, URL_PLACEHOLDER)
    made = stack.network.scheduler_security_group
    if made is not None:
        text = text.replace(made.security_group_id, SECURITY_GROUP_PLACEHOLDER)
    docs = json.loads(text)
    path = outdir / "manifests" / "gpu-scheduler.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_yaml(docs, header=MANIFEST_HEADER))
    return path


def write_monitoring(outdir: Path, config: DeployConfig) -> Path:
    """``monitoring/``: the AMP rule file and scrape configuration the stack deploys, for ``promtool`` and
    review, and the Grafana dashboards as JSON for import into Amazon Managed Grafana."""
    scrape = scrape_configuration(
        dcgm_namespace=config.dcgm_exporter_namespace, ksm_namespace=config.kube_state_metrics_namespace
    )
    folder = outdir / "monitoring"
    (folder / "grafana").mkdir(parents=True, exist_ok=True)
    (folder / "rules.yaml").write_text(dump_yaml(rule_groups()))
    (folder / "scrape.yaml").write_text(dump_yaml(scrape))
    for name in DASHBOARDS:
        (folder / "grafana" / f"{name}.json").write_text(json.dumps(render(name), indent=2) + "\n")
    return folder


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    outdir = os.environ.get("CDK_OUTDIR") or str(ROOT / "cdk.out")
    try:
        app, stack = build_app(read_context(argv, os.environ), outdir)
    except ConfigError as exc:
        print(f"cdk synth: {exc}", file=sys.stderr)
        return 2
    try:
        assembly = app.synth()
    except RuntimeError as exc:  # jsii wraps the failed cdk-nag validation; its report was printed above
        if "ValidationFailed" not in str(exc):
            raise
        print(f"cdk synth: cdk-nag found unacknowledged findings; see {outdir}/validation-report.json", file=sys.stderr)
        return 1
    out = Path(assembly.directory)
    manifests = write_manifests(stack, out)
    report = summary(assembly.get_stack_by_name(STACK_NAME).template, out, manifests)
    report["monitoring"] = str(write_monitoring(out, stack.config))
    print(json.dumps(report, indent=2))
    return 0


def summary(template: Mapping[str, Any], outdir: Path, manifests: Path) -> dict[str, Any]:
    """What was synthesised: resources by type, cdk-nag's verdict, and where the files are."""
    by_type: dict[str, int] = {}
    for resource in template["Resources"].values():
        by_type[resource["Type"]] = by_type.get(resource["Type"], 0) + 1
    nag: dict[str, Any] = {}
    report_path = outdir / "validation-report.json"
    if report_path.is_file():
        for plugin in json.loads(report_path.read_text()).get("pluginReports", []):
            nag[plugin["pluginName"]] = {
                "conclusion": plugin["conclusion"],
                "violations": len(plugin["violations"]),
                "acknowledged": len(plugin["suppressedViolations"]),
            }
    return {
        "stack": STACK_NAME,
        "resources": len(template["Resources"]),
        "resources_by_type": dict(sorted(by_type.items(), key=lambda kv: (-kv[1], kv[0]))),
        "cdk_nag": nag,
        "template": str(outdir / f"{STACK_NAME}.template.json"),
        "manifests": str(manifests),
    }


if __name__ == "__main__":
    sys.exit(main())
