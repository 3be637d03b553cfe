"""``examples/README.md`` is true: every command in its ``console`` blocks runs from the repository's root as
shown, and prints what is shown (``gpu-scheduler`` commands as they are; ``curl`` against the ``serve``
started earlier in the page)."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "examples" / "README.md"
BLOCK = re.compile(r"^```console\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def steps() -> list[tuple[str, str]]:
    """Each ``$ command`` of the page's console blocks, in order, with the output shown under it."""
    found: list[tuple[str, str]] = []
    for block in BLOCK.findall(PAGE.read_text()):
        for chunk in re.split(r"^\$ ", block, flags=re.MULTILINE)[1:]:
            command, _, output = chunk.partition("\n")
            found.append((command, output))
    return found


@pytest.fixture(scope="module")
def serving() -> Iterator[dict[str, str]]:
    """The page's ``serve`` command, on a free port; the URL it listens on, by the port the page names."""
    urls: dict[str, str] = {}
    started = []
    for command, _ in steps():
        argv = shlex.split(command)
        if argv[:2] == ["gpu-scheduler", "serve"]:
            port = argv[argv.index("--port") + 1]
            argv[argv.index("--port") + 1] = "0"
            process = subprocess.Popen([sys.executable, "-m", "gpu_scheduler", *argv[1:]], cwd=REPO,
                                       stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)  # fmt: skip
            assert process.stdout is not None
            urls[port] = json.loads(process.stdout.readline())["serving"]
            started.append(process)
    yield urls
    for process in started:
        process.terminate()
        process.wait(timeout=10)


def curl(argv: list[str], urls: dict[str, str]) -> str:
    """``curl -s [-d @FILE] URL`` (a POST with the file as its body), against the ``serve`` the page started."""
    data = None
    if "-d" in argv:
        data = (REPO / argv[argv.index("-d") + 1].removeprefix("@")).read_bytes()
    url = argv[-1]
    for port, real in urls.items():
        url = url.replace(f"http://127.0.0.1:{port}", real)
    with urllib.request.urlopen(urllib.request.Request(url, data=data), timeout=30) as reply:
        return str(reply.read().decode())


def test_the_page_shows_commands_of_each_kind() -> None:
    kinds = {tuple(shlex.split(command)[:2]) for command, _ in steps()}
    assert {("gpu-scheduler", "explain"), ("gpu-scheduler", "serve"), ("gpu-scheduler", "simulate")} <= kinds
    assert any(command.startswith("curl ") for command, _ in steps())


@pytest.mark.parametrize(("command", "shown"), [s for s in steps() if not s[0].startswith("gpu-scheduler serve")],
                         ids=[s[0][:70] for s in steps() if not s[0].startswith("gpu-scheduler serve")])  # fmt: skip
def test_each_example_prints_what_the_page_shows(command: str, shown: str, serving: dict[str, str]) -> None:
    argv = shlex.split(command)
    if argv[0] == "curl":
        printed = curl(argv, serving) + "\n"
    else:
        assert argv[0] == "gpu-scheduler", command
        done = subprocess.run([sys.executable, "-m", "gpu_scheduler", *argv[1:]], cwd=REPO, capture_output=True,
                              text=True, timeout=300)  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        printed = done.stdout
    assert [line.rstrip() for line in printed.splitlines()] == [line.rstrip() for line in shown.splitlines()]


@pytest.mark.parametrize("pod", sorted((REPO / "examples" / "pods").glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_pod_is_explained_on_the_example_cluster(pod: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "gpu_scheduler", "explain", "--pod", str(pod), "--cluster",
                           str(REPO / "examples" / "cluster.json"), "--json"], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["nodes_passing"] >= 1
