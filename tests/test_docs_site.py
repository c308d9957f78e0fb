"""The documentation site: it builds with ``mkdocs build --strict`` (no broken link,
anchor or docstring cross-reference), its reference has an entry for every name
``rho_actors`` exports, its command-line page is the parser, and the built site opens
in a real headless browser (Debian's ``chromium``), page by page, and its search
finds pages."""

from __future__ import annotations

import argparse
import functools
import http.server
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import rho_actors

from .conftest import WAIT_S, slack

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
BUILD_BOUND_S = 10 * WAIT_S  # mkdocs and mkdocstrings over the whole package: seconds, minutes on a loaded machine
BROWSER_BOUND_MS = int(max(WAIT_S, slack(60.0)) * 1000)  # one page load or search in the browser (scaled by load)
CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)


def _nav_pages() -> list[str]:
    config = (ROOT / "mkdocs.yml").read_text()
    return re.findall(r"^\s*- (?:[^\n]*: )?([\w/.-]+\.md)\s*$", config, flags=re.M)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, PYTHONPATH=str(ROOT), NO_MKDOCS_2_WARNING="1")
    run = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=BUILD_BOUND_S, check=False)
    assert run.returncode == 0, run.stderr[-4000:]
    assert "WARNING" not in run.stderr, run.stderr[-4000:]
    return out


def test_the_site_builds_strict_with_every_page_of_its_nav(site: Path) -> None:
    pages = _nav_pages()
    assert len(pages) >= 30 and len(set(pages)) == len(pages)
    for page in pages:
        assert (DOCS / page).is_file(), page
        html = site / (page[: -len(".md")] + "/index.html" if not page.endswith("index.md")
                       else page[: -len("index.md")] + "index.html")
        assert html.is_file(), html
    assert (site / "search" / "search_index.json").is_file()


def test_every_page_under_docs_is_in_the_nav() -> None:
    on_disk = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    nav = set(_nav_pages())
    assert not on_disk - nav, f"pages missing from mkdocs.yml's nav (one line each): {sorted(on_disk - nav)}"
    assert not nav - on_disk, f"mkdocs.yml's nav names pages that do not exist: {sorted(nav - on_disk)}"


def test_the_reference_has_an_entry_for_every_exported_name(site: Path) -> None:
    pages = "".join(p.read_text() for p in (DOCS / "reference" / "api").glob("*.md"))
    entries = re.findall(r"^::: rho_actors\.(\w+)$", pages, flags=re.M)
    assert sorted(entries) == sorted(set(entries))  # each once
    assert set(entries) >= set(rho_actors.__all__)
    api = "".join(p.read_text() for p in (site / "reference" / "api").rglob("index.html"))
    for name in rho_actors.__all__:
        assert f'id="rho_actors.{name}"' in api, f"{name}: no entry in the built reference"
    assert 'id="rho_actors.ActorSystem.start_loop"' in api  # members are documented, not only the classes


def test_the_design_pages_are_its_sections_in_order() -> None:
    index = (DOCS / "design" / "index.md").read_text()
    sections = re.findall(r"^\| §(\w+) \| \[([^\]]+)\]\(([\w-]+)\.md\)", index, flags=re.M)
    assert [n for n, _, _ in sections] == ["1", "2", "3", "4", "5", "6", "6a", "6b", "6c", "7"]
    for number, title, slug in sections:
        assert (DOCS / "design" / f"{slug}.md").read_text().startswith(f"# {number}. {title}\n"), slug


def test_the_command_line_page_is_the_parser() -> None:
    from rho_actors.cli import build_parser

    [block] = re.findall(r"```\n(rho-actors .*?)```", (DOCS / "reference" / "cli.md").read_text(), flags=re.S)
    documented: dict[str, set[str]] = {}
    command = ""
    for line in block.splitlines():
        if line.startswith("rho-actors "):
            words = line.split()[1:]
            command = " ".join(w for w in words[:2] if w.isalpha() and w.islower())
            documented.setdefault(command, set())
        documented[command].update(re.findall(r"--[a-z][a-z-]*", line))

    def leaves(parser: argparse.ArgumentParser, prefix: str = "") -> dict[str, set[str]]:
        found: dict[str, set[str]] = {}
        subparsers = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subparsers:
            return {prefix.strip(): {o for a in parser._actions for o in a.option_strings if o.startswith("--")}
                    - {"--help", "--verbose"}}  # --verbose: the command line's own, documented once
        own = {o for a in parser._actions for o in a.option_strings if o.startswith("--")} - {"--help"}
        own -= {"--verbose"} if prefix else set()
        if own:  # options of the command itself (rho-actors --version)
            found[prefix.strip()] = own
        for name, sub in subparsers[0].choices.items():
            found.update(leaves(sub, f"{prefix} {name}"))
        return found

    assert documented == leaves(build_parser())


@pytest.fixture(scope="module")
def served(site: Path) -> Iterator[str]:
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(BROWSER_BOUND_MS / 1000)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


def test_the_site_opens_in_a_browser_and_its_search_finds_pages(served: str) -> None:
    if CHROMIUM is None:
        pytest.skip("Debian's chromium is not installed (apt-get install chromium; .ci/run installs it)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (the dev extra has it)")
    errors: list[str] = []
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, timeout=BROWSER_BOUND_MS)
        try:
            page = browser.new_page()
            page.set_default_timeout(BROWSER_BOUND_MS)
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            checked = {"": "rho_actors", "getting-started/": "Getting started",
                       "guides/supervision/": "Supervision and stateful servers", "design/isolation/": "5. Isolation",
                       "reference/api/system/": "rho_actors: the system and loops"}
            for path, heading in checked.items():
                response = page.goto(f"{served}/{path}")
                assert response is not None and response.status == 200, path
                assert page.locator("article h1").first.inner_text().strip().startswith(heading), path
            assert page.locator('[id="rho_actors.ActorSystem"]').count() == 1  # the API entry rendered

            page.goto(f"{served}/")
            page.locator("label.md-search__icon, .md-search__input").first.click()
            # typed, key by key, once the search index is loaded (the results' meta line reads "Initializing
            # search" until then): the search reads its box when it becomes ready and then at each key, so a
            # query filled in at once after it was ready (a loaded machine's slower click) was never searched
            page.wait_for_function("() => !/Initializing/.test("
                                   "document.querySelector('.md-search-result__meta')?.textContent ?? 'Initializing')")
            page.locator("input.md-search__input").press_sequentially("restart intensity")
            results = page.locator(".md-search-result__item")
            results.first.wait_for(state="visible")
            assert results.count() >= 3
            first = page.locator(".md-search-result__item a").first.get_attribute("href")
            assert first is not None
            response = page.goto(first if first.startswith("http") else f"{served}/{first.lstrip('./')}")
            assert response is not None and response.status == 200, first
        finally:
            browser.close()
    assert not errors, errors
