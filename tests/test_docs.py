"""The README and docs/ stay true to the tree: generated tables current, links alive, every page reachable
from the README, the README short, every path, module and bench command they name real, and the package
layout complete. The claims a test can check against the code are in ``tests/test_docs_claims.py``."""

from __future__ import annotations

import ast
import re
import shlex
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
    expected = {"extender-settings", "node-state-settings", "deletion-cost-settings", "consolidation-settings",
                "metric-catalogue", "kubernetes-identities", "admission-policies", "scheduler-configuration",
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
