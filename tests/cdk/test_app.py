"""``cdk/app.py``: context precedence, clear failures, and what a synth writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from cdk.app import main, read_context


def test_command_line_context_wins_over_the_environment_which_wins_over_cdk_json() -> None:
    context = read_context(
        ["-c", "clusterName=cli", "--context", "sharing=false"],
        {"CDK_CONTEXT_JSON": json.dumps({"clusterName": "env", "extenderWeight": 3})},
    )
    assert context["clusterName"] == "cli" and context["extenderWeight"] == 3 and context["sharing"] == "false"
    # cdk.json's feature flags are always there.
    assert context["@aws-cdk/aws-apigateway:disableCloudWatchRole"] is True


def test_a_bad_context_stops_synth_with_every_problem(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["-c", "vpcId=vpc-1", "-c", f"packageDir={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert "clusterName: required" in err and "vpcId: expected vpc-" in err


def test_a_missing_package_stops_synth_with_the_command_to_run(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert main(["-c", "clusterName=prod", "-c", f"packageDir={tmp_path}"]) == 2
    assert "run `make package LAMBDA_ARCH=arm64` first" in capsys.readouterr().err


def test_synth_writes_the_template_the_nag_report_and_the_manifests(
    package_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CDK_OUTDIR", str(tmp_path))
    assert main(["-c", "clusterName=prod", "-c", f"packageDir={package_dir}", "-c", "extenderWeight=8"]) == 0
    summary = json.loads(capsys.readouterr().out)
    # The nine of docs/deploy.md, and the CDK-owned provider behind the endpoint-policy call.
    assert summary["cdk_nag"]["AwsSolutions"] == {"conclusion": "success", "violations": 0, "acknowledged": 10}
    template = json.loads(Path(summary["template"]).read_text())
    assert summary["resources"] == len(template["Resources"])
    assert summary["resources_by_type"]["AWS::Lambda::Function"] == 4  # three Lambdas and the custom resource's
    manifests = Path(summary["manifests"])
    assert manifests == tmp_path / "manifests" / "gpu-scheduler.yaml"
    docs = list(yaml.safe_load_all(manifests.read_text()))
    (config_map,) = [d for d in docs if d["kind"] == "ConfigMap"]
    (extender,) = yaml.safe_load(config_map["data"]["config.yaml"])["extenders"]
    # Before a deploy the URL is unknown: a readable placeholder of the endpoint-specific hostname, never a
    # CDK token.
    assert extender["urlPrefix"] == "https://API_ID-VPCE_ID.execute-api.REGION.amazonaws.com/v1"
    assert extender["weight"] == 8
    assert "${Token" not in manifests.read_text()
    assert "ValidatingAdmissionPolicy" in [d["kind"] for d in docs]
    scrape = yaml.safe_load((Path(summary["monitoring"]) / "scrape.yaml").read_text())
    (dcgm,) = [job for job in scrape["scrape_configs"] if job["job_name"] == "dcgm-exporter"]
    assert dcgm["kubernetes_sd_configs"][0]["namespaces"] == {"names": ["gpu-operator"]}
