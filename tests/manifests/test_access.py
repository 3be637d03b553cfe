"""The Lambdas' Kubernetes identities (``manifests/access.py``): each group's RBAC is exactly the calls its
function makes. Their admission policies are evaluated in ``test_admission_cel.py``."""

from __future__ import annotations

from manifests.access import DELETION_COST, EXTENDER, NODE_STATE, lambda_rbac


def test_each_lambda_group_may_do_exactly_what_its_function_calls() -> None:
    docs = lambda_rbac(sharing=True)
    roles = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ClusterRole"}
    granted = {}
    for binding in (d for d in docs if d["kind"] == "ClusterRoleBinding"):
        (subject,) = binding["subjects"]
        rules = roles[binding["roleRef"]["name"]]["rules"]
        granted[subject["name"]] = {(g, r, v) for rule in rules for g in rule["apiGroups"]
                                    for r in rule["resources"] for v in rule["verbs"]}  # fmt: skip
    assert granted == {
        EXTENDER.group: {("", "pods", "get"), ("", "nodes", "get"), ("", "pods/binding", "create")},
        NODE_STATE.group: {
            ("", "nodes", "list"),
            ("", "nodes", "watch"),
            ("", "nodes", "patch"),
            ("", "pods", "list"),
            ("", "pods", "watch"),
            *{
                ("resource.k8s.io", kind, verb)
                for kind in ("deviceclasses", "resourceslices", "resourceclaims")
                for verb in ("list", "watch")
            },
        },
        DELETION_COST.group: {
            ("", "pods", "get"), ("", "pods", "list"), ("", "pods", "patch"), ("apps", "deployments", "get"),
        },
    }  # fmt: skip
    # Of Deployments, Karpenter's only (its feature gates decide which annotation carries the costs).
    (named,) = [rule for rule in roles[DELETION_COST.role_name]["rules"] if "resourceNames" in rule]
    assert named["resourceNames"] == ["karpenter"] and named["resources"] == ["deployments"]
    assert EXTENDER.group not in {d["subjects"][0]["name"] for d in lambda_rbac(sharing=False)
                                  if d["kind"] == "ClusterRoleBinding"}  # fmt: skip
