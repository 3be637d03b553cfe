"""The README and docs/ stay true to the tree: generated tables current, links alive, every page reachable
from the README, the README short, every path, module and bench command they name real, and the claims
a test can check (which pods reach the extender, the tie rule, timeouts and defaults) equal to the code."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import re
import shlex
import zlib
from functools import cache
from pathlib import Path

import pytest

from tests.conftest import REPO
from tools import docs as tools_docs

README = REPO / "README.md"
DOCS = REPO / "docs"
PAGES = [README, *tools_docs.pages(DOCS)]
README_MAX_LINES = 150

# Top-level folders whose files the docs may name; build outputs (build/, cdk.out/) and ../shared are not.
SOURCE_ROOTS = (
    "scheduler_core",
    "adapters",
    "application",
    "gpu_scheduler",
    "lambdas",
    "manifests",
    "shares",
    "testing",
    "bench",
    "cdk",
)
PATH_ROOTS = (*SOURCE_ROOTS, "tools", "tests", "docs")

FENCE = re.compile(r"^```.*?^```[^\n]*$", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"`((?:[^`\n]|\n(?!\n))+)`")  # a span may wrap, but not across a blank line
LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} +(.+?) *#*$", re.MULTILINE)
PATH = re.compile(rf"^(?:{'|'.join(PATH_ROOTS)})(?:/[\w.*-]+)*/?$")
DOTTED = re.compile(rf"^(?:python -m )?((?:{'|'.join((*SOURCE_ROOTS, 'tools'))})(?:\.\w+)+)(?=$|[\s(\[])")
FILE_SUFFIXES = frozenset({"json", "out", "yaml", "py", "md", "toml", "lock", "zip", "npz"})  # cdk.json, cdk.out


def _prose(text: str) -> str:
    """``text`` without its fenced code blocks (diagrams, YAML, shell sessions)."""
    return FENCE.sub("", text)


def code_spans(text: str) -> list[str]:
    """The inline code spans of ``text``, outside fenced blocks, a wrapped span joined with a space."""
    return [" ".join(span.split()) for span in CODE_SPAN.findall(_prose(text))]


def links(text: str) -> list[str]:
    """The link targets of ``text``, outside fenced blocks and code spans."""
    return LINK.findall(CODE_SPAN.sub("", _prose(text)))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    found: set[str] = set()
    for heading in HEADING.findall(_prose(path.read_text())):
        base = slug(heading)
        name, n = base, 0
        while name in found:  # GitHub numbers repeated headings: x, x-1, x-2
            n += 1
            name = f"{base}-{n}"
        found.add(name)
    return frozenset(found)


def broken_links(page: Path) -> list[str]:
    """Each relative link of ``page`` whose file, or whose heading in a Markdown file, does not exist."""
    broken = []
    for target in links(page.read_text()):
        if re.match(r"^[a-z][a-z+.-]*:", target):  # https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        dest = (page.parent / file_part).resolve() if file_part else page
        if not dest.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target} (no heading #{anchor} in {dest.name})")
    return broken


def missing_paths(text: str) -> list[str]:
    """Each repository path named in a code span of ``text`` that matches no file or folder."""
    named = {span for span in code_spans(text) if PATH.match(span)}
    return sorted(p for p in named if not (any(REPO.glob(p.rstrip("/"))) if "*" in p else (REPO / p).exists()))


def _defines(module: Path, name: str) -> bool:
    """Whether the Python file ``module`` binds ``name`` at top level (def, class, assignment, import)."""
    for node in ast.parse(module.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and node.name == name:
            return True
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return True
        if isinstance(node, ast.Import | ast.ImportFrom) and any(
            (alias.asname or alias.name.split(".")[0]) == name for alias in node.names
        ):
            return True
    return False


def resolves(dotted: str) -> bool:
    """Whether ``pkg.module.attr`` names a module of this repository and, after it, a name it defines
    (read from the source; nothing is imported)."""
    parts = dotted.split(".")
    here = REPO
    for i, part in enumerate(parts):
        if (here / part).is_dir():
            here = here / part
            continue
        if (here / f"{part}.py").is_file():
            rest = parts[i + 1 :]
            return not rest or _defines(here / f"{part}.py", rest[0])
        init = here / "__init__.py"
        return i > 0 and init.is_file() and _defines(init, part)
    return True


def unresolved_names(text: str) -> list[str]:
    """Each dotted module reference in a code span of ``text`` (``scheduler_core.state.snapshot.build_snapshot``,
    ``python -m testing.kube_double``) that names no module or attribute of this repository."""
    named = {m[1] for span in code_spans(text) if (m := DOTTED.match(span))}
    named = {name for name in named if name.rsplit(".", 1)[-1] not in FILE_SUFFIXES}
    return sorted(name for name in named if not resolves(name))


def bench_commands(text: str) -> list[str]:
    """The argument lists of every ``gpu-scheduler bench SUITE ...`` in a code span of ``text``, with
    placeholders (an upper-case suite) and ``--help`` left out."""
    found = []
    for span in code_spans(text):
        for command in re.split(r"&&|\|", span):
            head, sep, args = command.strip().partition("gpu-scheduler bench ")
            if sep and not head and args and not args.split()[0].isupper() and "--help" not in args:
                found.append(args.strip())
    return found


def test_every_generated_block_in_docs_is_what_tools_docs_writes() -> None:
    assert tools_docs.stale(DOCS) == []
    held = {name for page in tools_docs.pages(DOCS) for name, _ in tools_docs.blocks_in(page.read_text())}
    expected = {"extender-settings", "node-state-settings", "deletion-cost-settings", "metric-catalogue",
                "kubernetes-identities", "admission-policies", "scheduler-configuration",
                "pods-reaching-the-extender", "extender-timeouts", "share-env", "autoscaler-labels",
                "gpu-instance-types"}  # fmt: skip
    assert held == set(tools_docs.BLOCKS) == expected


def test_a_stale_or_unknown_or_missing_block_is_named(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    current = tools_docs.block_body("metric-catalogue")
    (docs / "a.md").write_text(
        "# A\n\n<!-- generated by tools/docs.py: metric-catalogue -->\n"
        + current.replace("Milliseconds", "Seconds", 1)
        + "<!-- end of generated block -->\n"
        "<!-- generated by tools/docs.py: no-such-table -->\n<!-- end of generated block -->\n"
    )
    problems = tools_docs.stale(docs)
    assert any("'metric-catalogue' is stale" in p for p in problems), problems
    assert any("unknown generated block 'no-such-table'" in p for p in problems), problems
    assert any("no page holds the generated block 'extender-settings'" in p for p in problems), problems
    assert tools_docs.main(["--check", "--docs", str(docs)]) == 1
    tools_docs.main(["--docs", str(docs)])
    assert tools_docs.blocks_in((docs / "a.md").read_text())[0] == ("metric-catalogue", current)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_points_at_a_file_and_heading_that_exist(page: Path) -> None:
    assert broken_links(page) == []


def test_the_link_check_sees_a_missing_file_and_a_missing_heading(tmp_path: Path) -> None:
    (tmp_path / "b.md").write_text("# Bee\n\n## Second part\n")
    page = tmp_path / "a.md"
    page.write_text(
        "[ok](b.md#second-part) [web](https://example.com) [gone](c.md) [no heading](b.md#third)\n"
        "`[not a link](x.md)`\n```\n[in a fence](y.md)\n```\n"
    )
    assert broken_links(page) == ["c.md (no such file)", "b.md#third (no heading #third in b.md)"]


def test_every_docs_page_is_linked_from_the_readme() -> None:
    linked = {(README.parent / t.partition("#")[0]).resolve() for t in links(README.read_text())}
    assert [p.relative_to(REPO) for p in tools_docs.pages(DOCS) if p.resolve() not in linked] == []
    assert len(tools_docs.pages(DOCS)) >= 13


def test_the_readme_is_a_front_door_of_at_most_150_lines() -> None:
    n_lines = len(README.read_text().splitlines())
    assert n_lines <= README_MAX_LINES, f"README.md has {n_lines} lines; move detail into docs/"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_repository_path_a_page_names_exists(page: Path) -> None:
    assert missing_paths(page.read_text()) == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_module_a_page_names_exists_with_the_name_after_it(page: Path) -> None:
    assert unresolved_names(page.read_text()) == []


def test_the_path_and_module_checks_see_stale_names() -> None:
    text = (
        "`scheduler_core/gpu_fit.py` `scheduler_core/scoring/gpu_fit.py` `lambdas/<name>/handler.py` "
        "`scheduler_core/scoring/*.py` `scheduler_core/nothing*.py` `build/lambda/package.json` `../shared/x.md` "
        "`scheduler_core.snapshot.build_snapshot(nodes)` `scheduler_core.state.snapshot.build_snapshot(nodes)` "
        "`python -m gpu_scheduler.kube_double --nodes 5` `python -m testing.kube_double` "
        "`scheduler_core.extender.Extender` `scheduler_core.extender.NoSuchThing`"
    )
    assert missing_paths(text) == ["scheduler_core/gpu_fit.py", "scheduler_core/nothing*.py"]
    assert unresolved_names(text) == [
        "gpu_scheduler.kube_double",
        "scheduler_core.extender.NoSuchThing",
        "scheduler_core.snapshot.build_snapshot",
    ]


def test_every_bench_command_the_docs_give_parses() -> None:
    from bench.cli import build_parser

    commands = [c for page in PAGES for c in bench_commands(page.read_text())]
    assert len(commands) >= 8
    rejected = []
    for command in commands:
        try:
            build_parser().parse_args(shlex.split(command))
        except SystemExit:
            rejected.append(command)
    assert rejected == [], f"the bench CLI rejects: {rejected}"


def test_the_bench_command_check_finds_commands_and_skips_placeholders() -> None:
    text = (
        "`gpu-scheduler bench extender --json` `make package && gpu-scheduler bench synth --runs 3` "
        "`gpu-scheduler bench SUITE`"
    )
    assert bench_commands(text) == ["extender --json", "synth --runs 3"]


def test_the_security_pages_limits_are_the_codes() -> None:
    """docs/security.md promises limits a reviewer will hold the code to: each figure it gives is the
    constant the code uses."""
    from scheduler_core.k8s import annotations, pods, quantity
    from scheduler_core.state.readings import ASSUMED_TTL_S, MAX_ASSUMED

    text = " ".join((DOCS / "security.md").read_text().split())
    promised = [
        f"at most {MAX_ASSUMED:,} of them",
        f"each dropped {ASSUMED_TTL_S:g} s after it was made",
        f"`gpu-scheduler.io/peers`: at most {annotations.MAX_PEERS_CHARS:,} characters",
        f"JSON nested at most {annotations.MAX_PEERS_JSON_DEPTH} deep",
        f"at most {annotations.MAX_PEERS} peers",
        f"weights of at most {annotations.MAX_WEIGHT_CHARS} ASCII characters",
        f"`gpu-scheduler.io/assigned-gpus`: at most {annotations.MAX_ASSIGNED_GPUS_CHARS:,} characters",
        f"`gpu.nvidia.com/model`: at most {pods.MAX_MODELS_CHARS:,} characters",
        f"`gpu.nvidia.com/memory` and every resource quantity: at most {quantity.MAX_QUANTITY_CHARS} characters",
    ]
    assert pods.MAX_MEMORY_CHARS == quantity.MAX_QUANTITY_CHARS  # the page gives them as one figure
    assert [phrase for phrase in promised if phrase not in text] == []


def _flat(page: str) -> str:
    """The text of ``docs/<page>`` (or README.md) with every run of whitespace one space, so that a claim
    may wrap."""
    return " ".join((REPO / page if page == "README.md" else DOCS / page).read_text().split())


def test_the_pages_say_which_pods_reach_the_extender_as_the_generated_configuration_does() -> None:
    """Without ``managedResources`` kube-scheduler sends the extender every pod of the profile; the pages
    say so exactly where the generated configuration lists none, and name what it lists and ignores."""
    from manifests.scheduler import SchedulerOptions, extender_entry, profile
    from scheduler_core.k8s.names import MILLI_RESOURCE

    url = tools_docs.EXAMPLE_EXTENDER_URL
    default = extender_entry(SchedulerOptions(extender_url=url))
    every_pod = "managedResources" not in default
    every_pod_claims = {
        "architecture.md": "it calls the extender for every pod of the profile",
        "extender-protocol.md": "The default configuration lists no `managedResources`, so kube-scheduler calls "
        "the extender for every pod of the profile",
        "scheduling.md": "the generated profile lists no `managedResources`, so kube-scheduler calls it for every "
        "pod it schedules",
        "operations.md": "CPU-only ones included, since the generated profile sends it every pod",
        "README.md": "**Every pod of the profile** reaches the extender, CPU-only ones included",
    }
    assert {page: claim in _flat(page) for page, claim in every_pod_claims.items()} == dict.fromkeys(
        every_pod_claims, every_pod
    )
    stale = "calls the extender for the pods that request `nvidia.com/gpu`"
    assert [page for page in every_pod_claims if every_pod and stale in _flat(page)] == []

    # --gpu-pods-only with sharing: the milli resource is listed, and kube-scheduler ignores it or not.
    listed = extender_entry(SchedulerOptions(extender_url=url, sharing=True, gpu_pods_only=True))["managedResources"]
    milli = next(r for r in listed if r["name"] == MILLI_RESOURCE)
    assert f"`ignoredByScheduler: {str(milli['ignoredByScheduler']).lower()}` with `--gpu-pods-only`" in _flat(
        "sharing.md"
    )
    # Sharing without --gpu-pods-only: NodeResourcesFit's ignoredResources.
    fit = next(c["args"] for c in profile(SchedulerOptions(extender_url=url, sharing=True))["pluginConfig"])
    ignored = f"`ignoredResources: [{', '.join(fit['ignoredResources'])}]`"
    assert f"NodeResourcesFit's {ignored}" in _flat("extender-protocol.md")
    assert f"{ignored} on NodeResourcesFit when sharing is on" in _flat("scheduling.md")
    ignorable = str(default["ignorable"]).lower()
    assert f"(`ignorable: {ignorable}`)" in _flat("operations.md")
    assert ("The extender is not `ignorable`" in _flat("architecture.md")) == (ignorable == "false")


def _prioritize_on_nodes_alike(names: list[str], requests: dict[str, str]) -> dict[str, int]:
    """The extender's prioritize scores for a pod with ``requests`` over identical empty 8-GPU nodes, sent
    as full Node objects (no cluster state: every node counts as empty)."""
    from scheduler_core.extender.facade import Extender

    labels = {"gpu.nvidia.com/model": "A100", "gpu.nvidia.com/memory": "40960", "gpu.nvidia.com/count": "8"}
    allocatable = {"nvidia.com/gpu": "8", "cpu": "96", "memory": "1Ti", "pods": "110"}
    nodes = [{"metadata": {"name": n, "labels": labels}, "status": {"allocatable": allocatable}} for n in names]
    container = {"name": "main", "resources": {"limits": requests}}
    pod = {
        "metadata": {"name": "p", "namespace": "default", "uid": "u-1"},
        "spec": {"schedulerName": "gpu-scheduler", "containers": [container]},
    }
    status, reply = Extender().handle("prioritize", json.dumps({"Pod": pod, "Nodes": {"items": nodes}}).encode())
    assert status == 200, reply
    return {entry["Host"]: entry["Score"] for entry in json.loads(reply)}


@pytest.mark.parametrize(
    "requests", [{"nvidia.com/gpu": "1"}, {"gpu-scheduler.io/gpu-milli": "500"}], ids=["whole GPU", "share"]
)
def test_the_tie_rule_the_scheduling_page_states_is_what_prioritize_does(requests: dict[str, str]) -> None:
    """Nodes that score alike: the page names who keeps the top score (by the CRC-32 of the node names,
    ``NodeTable.tie_rank``) and what the others get, and both are read from a real prioritize."""
    names = ["gpu-node-a", "gpu-node-b", "gpu-node-c", "gpu-node-d", "gpu-node-e"]
    scores = _prioritize_on_nodes_alike(names, requests)
    top = max(scores.values())
    winners = [name for name in names if scores[name] == top]
    crc = {name: zlib.crc32(name.encode()) for name in names}
    rank = {min(names, key=crc.__getitem__): "lowest", max(names, key=crc.__getitem__): "highest"}
    others = {scores[name] for name in names if name not in winners}
    text = _flat("scheduling.md")
    if len(winners) == 1 and len(others) == 1:
        (other,) = others
        drop = {1: "one", 2: "two"}.get(top - other, str(top - other))
        claims = [
            f"When two or more nodes reach {top}, the one whose name has the {rank.get(winners[0], '?')} CRC-32 "
            f"(`NodeTable.tie_rank`) keeps {top} and every other node above 1 drops {drop} point",
            f"When every node has the same raw score above 0, one node gets {top} and every other node {other}",
        ]
    else:  # the tie left to kube-scheduler: the page would have to say that instead
        claims = [f"When every node has the same raw score above 0, every node gets {top}"]
    assert [claim for claim in claims if claim not in text] == []


def test_every_httptimeout_the_pages_state_is_the_generated_one() -> None:
    """Each ``httpTimeout`` given with a number is the generated configuration's; DESIGN's 5 s is cited only
    beside it; and the figures sized to it say so truly."""
    from manifests.scheduler import SchedulerOptions
    from scheduler_core.state.readings import ASSUMED_TTL_S

    http_s = SchedulerOptions(extender_url=tools_docs.EXAMPLE_EXTENDER_URL).http_timeout_s
    forms = [
        re.compile(r"`httpTimeout`\)? (?:is|of) (\d+(?:\.\d+)?) s\b"),
        re.compile(r"\b(\d+(?:\.\d+)?) s `httpTimeout`"),
        re.compile(r"the generated configuration sets (\d+(?:\.\d+)?) s\b"),
    ]
    stated = [
        (page.name, value)
        for page in PAGES
        for form in forms
        for value in form.findall(" ".join(page.read_text().split()))
    ]
    assert len(stated) >= 4, stated
    assert [(page, value) for page, value in stated if float(value) != http_s] == []
    for page in PAGES:
        text = " ".join(page.read_text().split())
        if re.search(r"DESIGN[^.]*`httpTimeout`", text):
            assert f"the generated configuration sets {http_s:g} s" in text, page.name
    if "(the generated `httpTimeout`)" in _flat("security.md"):
        assert http_s == ASSUMED_TTL_S


def test_every_timeout_and_budget_the_pages_state_is_the_codes() -> None:
    from application.extender.service import LIVE_MARGIN_S, SYNC_TIMEOUT_S
    from scheduler_core.extender.facade import CATCH_UP_S
    from scheduler_core.state.readings import ASSUMED_TTL_S, DEFAULT_MARGIN_S
    from shares.binder import BIND_BUDGET_S, BIND_DYNAMODB, BINDING_RESERVE_S, CONFIRM_S, LedgerBinder

    ledger_s = inspect.signature(LedgerBinder).parameters["ledger_budget_s"].default
    connect, read = BIND_DYNAMODB["connect_timeout"], BIND_DYNAMODB["read_timeout"]
    attempts = BIND_DYNAMODB["retries"]["max_attempts"]
    promised = {
        "sharing.md": [
            f"The whole bind has {BIND_BUDGET_S:g} s for its Kubernetes calls",
            f"the ledger's part of the bind's budget ({ledger_s:g} s, inside",
            f"{connect:g} s to connect, {read:g} s to read, {attempts} attempts",
            f"with {CONFIRM_S:g} s past the bind's budget for it",
            f"keeping {BINDING_RESERVE_S:g} s for the Binding",
            f"waits up to {CATCH_UP_S:g} s for the live state",
            f"lingered for `margin_s` ({LIVE_MARGIN_S:g} s)",
            f"less {DEFAULT_MARGIN_S:g} s for the refresher's listing",
        ],
        "operations.md": [
            f"({connect:g} s connect, {read:g} s read, {attempts} attempts)",
            f"`serve` waits up to {SYNC_TIMEOUT_S:g} s for its first lists",
        ],
        "security.md": [f"can move scores for those {ASSUMED_TTL_S:g} s"],
    }
    missing = {page: [phrase for phrase in phrases if phrase not in _flat(page)] for page, phrases in promised.items()}
    assert missing == {page: [] for page in promised}


def _setting_defaults() -> dict[str, float]:
    """Every numeric setting of the three Lambdas, by environment variable, at its declared default."""
    from application.deletion_cost.settings import DeletionCostSettings
    from application.extender.settings import ExtenderSettings
    from application.node_state.settings import NodeStateSettings

    found = {}
    for cls in (ExtenderSettings, NodeStateSettings, DeletionCostSettings):
        for f in dataclasses.fields(cls):
            if "env" in f.metadata and isinstance(f.default, int | float) and not isinstance(f.default, bool):
                found[f.metadata["env"]] = float(f.default)
    return found


SETTING_WITH_VALUE = [
    re.compile(r"`([A-Z][A-Z0-9_]+)` \((\d+(?:\.\d+)?)(?: s)?\)"),  # `PASSES` (2), `INTERVAL_S` (30 s)
    re.compile(r"\(`([A-Z][A-Z0-9_]+)`, (\d+(?:\.\d+)?) s\)"),  # (`MAX_SNAPSHOT_AGE_S`, 180 s)
]


def stated_settings(text: str) -> list[tuple[str, float]]:
    """Each ``(VARIABLE, value)`` that ``text`` gives as a setting's value, in the two forms the pages use."""
    flat = " ".join(text.split())
    return [(name, float(value)) for form in SETTING_WITH_VALUE for name, value in form.findall(flat)]


def test_every_setting_value_the_pages_give_is_its_default() -> None:
    defaults = _setting_defaults()
    stated = [(page.name, name, value) for page in PAGES for name, value in stated_settings(page.read_text())]
    known = [(page, name, value) for page, name, value in stated if name in defaults]
    assert len(known) >= 5, stated
    assert [(page, name, value, defaults[name]) for page, name, value in known if value != defaults[name]] == []
    snapshot_refresh_s = defaults["SNAPSHOT_REFRESH_S"]
    assert f"(every `--refresh-s`, {snapshot_refresh_s:g} s by default)" in _flat("architecture.md")


def test_the_claim_checks_see_a_wrong_figure() -> None:
    """The forms the claim checks read, on a page that states a wrong value."""
    assert stated_settings("`PASSES` (3) passes `INTERVAL_S`\n(45 s) apart, (`MAX_SNAPSHOT_AGE_S`, 60 s)") == [
        ("PASSES", 3.0),
        ("INTERVAL_S", 45.0),
        ("MAX_SNAPSHOT_AGE_S", 60.0),
    ]


def test_the_deletion_cost_ranges_the_pages_give_are_the_codes() -> None:
    from scheduler_core.deletion_cost.policy import COST_RANGES

    ranges = {name: (low, high) for name, low, high in COST_RANGES}
    medium, high = ranges["medium"], ranges["high"]
    assert ranges["default"] == (0, 0)
    assert f"0 the default; {medium[0]}..{medium[1]} medium; {high[0]}..1000 high" in _flat("deletion-cost.md")
    assert f"`default` 0, `medium` {medium[0]}-{medium[1]}, `high` {high[0]} and above" in _flat("operations.md")


LAYOUT_ROOTS = (*SOURCE_ROOTS, "tools")


def layout_gaps(page: str, root: Path) -> tuple[list[str], list[str]]:
    """The modules under ``root`` that the layout tree of ``page`` (docs/architecture.md's first code block
    after "Package layout") does not name, and the ``*.py`` names it gives that no module has."""
    block = page.split("## Package layout and import rules", 1)[1].split("```", 2)[1]
    words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", block))
    found = [p for top in LAYOUT_ROOTS for p in sorted((root / top).rglob("*.py"))]
    unnamed = [
        str(p.relative_to(root))
        for p in found
        if p.name not in ("__init__.py", "__main__.py", "conftest.py") and p.stem not in words
    ]
    stems = {p.stem for p in found}
    gone = sorted(name for name in set(re.findall(r"([A-Za-z_][A-Za-z0-9_]*)\.py", block)) if name not in stems)
    return unnamed, gone


def test_the_layout_in_architecture_names_every_module_and_only_real_ones() -> None:
    assert layout_gaps((REPO / "docs" / "architecture.md").read_text(), REPO) == ([], [])


def test_the_layout_check_sees_a_module_left_out_and_one_that_is_gone(tmp_path: Path) -> None:
    (tmp_path / "adapters").mkdir()
    for name in ("kube.py", "new_thing.py", "__init__.py"):
        (tmp_path / "adapters" / name).write_text("")
    page = "## Package layout and import rules\n\n```\nadapters/  kube.py, old_thing.py\n```\n"
    assert layout_gaps(page, tmp_path) == (["adapters/new_thing.py"], ["old_thing"])
