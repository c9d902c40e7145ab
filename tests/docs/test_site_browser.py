"""The built site in a headless browser: search answers, every diagram is drawn whole, wide blocks scroll
inside the column, and nothing is loaded from outside the site (air-gapped clusters are common).

The browser is Debian's chromium driven by Playwright (Playwright's own browser builds are downloaded
from outside the package registries, which this project cannot reach); ``.ci/run`` installs it. Without
it the tests are skipped locally and fail under CI, as the MinIO tests do.
"""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
DIAGRAM_PAGES = {
    "concepts/executions/": "One object, two executions, never at once",
    "concepts/modes/": "One Kueue-mode admission",
    "concepts/guard/": "The components",
    "concepts/objects-and-submissions/": "An object's states",
    "runbook/lost-node/": "Deciding what ends the wait on a lost node",
}


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        found = None
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("the docs' browser check needs Debian's chromium and playwright (.ci/run installs them)")
        pytest.skip("no chromium or playwright here: apt-get install chromium; pip install playwright")
    return found


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The site built strict, served over HTTP on localhost (search loads its index with fetch)."""
    out = tmp_path_factory.mktemp("site")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--clean", "--site-dir", str(out)],
        cwd=ROOT, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src")}, check=False,
    )
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stdout}\n{result.stderr}"

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(out)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def browser(served: str) -> Iterator[Any]:
    executable = _chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=executable, args=["--no-sandbox", "--disable-gpu",
                                                                "--disable-dev-shm-usage"])
        yield b
        b.close()


@pytest.fixture
def page(browser: Any, served: str) -> Iterator[Any]:
    """A page that records every request it makes outside the served site."""
    pg = browser.new_page(viewport={"width": 1280, "height": 900})
    pg.outside = []
    pg.on("request", lambda r: None if r.url.startswith((served, "data:")) else pg.outside.append(r.url))
    yield pg
    pg.close()


def test_search_answers_in_a_browser(page: Any, served: str) -> None:
    page.goto(served + "search.html?q=out-of-service")
    page.wait_for_selector("#mkdocs-search-results a", timeout=20_000)
    links = page.eval_on_selector_all("#mkdocs-search-results a", "els => els.map(e => e.getAttribute('href'))")
    assert any("runbook/lost-node/" in link for link in links), links
    # and from the search box of any page, as a reader would
    page.goto(served + "concepts/promise/")
    page.fill("input[name=q]", "submission record")
    page.press("input[name=q]", "Enter")
    page.wait_for_selector("#mkdocs-search-results a", timeout=20_000)
    assert page.locator("#mkdocs-search-results a").count() > 0
    assert page.outside == []


# For each diagram: its drawn pixels (non-white) as a fraction of the image, and the drawn pixels in its
# rightmost 4 px band (text cut off at the edge shows there).
MEASURE = """img => {
  const c = document.createElement('canvas');
  c.width = img.naturalWidth; c.height = img.naturalHeight;
  const g = c.getContext('2d');
  g.fillStyle = '#fff'; g.fillRect(0, 0, c.width, c.height); g.drawImage(img, 0, 0);
  const d = g.getImageData(0, 0, c.width, c.height).data;
  let ink = 0, edge = 0;
  for (let y = 0; y < c.height; y++) for (let x = 0; x < c.width; x++) {
    const i = (y * c.width + x) * 4;
    if (d[i] < 128 || d[i + 1] < 128 || d[i + 2] < 128) { ink++; if (x >= c.width - 4) edge++; }
  }
  return {w: c.width, h: c.height, ink: ink / (c.width * c.height), edge};
}"""


@pytest.mark.parametrize("path", sorted(DIAGRAM_PAGES))
def test_every_diagram_is_drawn_whole(page: Any, served: str, path: str, tmp_path: Path) -> None:
    """A screenshot of each diagram: it loads, it has ink, none is cut at its right edge, and its caption
    is its title; the screenshot is kept in the test's directory for a person to look at."""
    page.goto(served + path)
    figure = page.locator("figure.diagram").first
    figure.scroll_into_view_if_needed()
    img = figure.locator("img")
    assert img.evaluate("i => i.complete && i.naturalWidth > 0")
    measured = img.evaluate(MEASURE)
    assert measured["w"] >= 300 and measured["h"] >= 100, measured
    assert 0.005 < measured["ink"] < 0.5, measured
    assert measured["edge"] == 0, f"the diagram is cut at its right edge: {measured}"
    assert DIAGRAM_PAGES[path] in figure.locator("figcaption").inner_text()
    assert (img.get_attribute("alt") or "").startswith(DIAGRAM_PAGES[path])
    shot = figure.screenshot(path=str(tmp_path / (path.strip("/").replace("/", "-") + ".png")))
    assert shot[:8] == b"\x89PNG\r\n\x1a\n" and len(shot) > 2000
    assert page.outside == []


def test_wide_blocks_scroll_inside_the_column_and_code_is_highlighted(page: Any, served: str) -> None:
    page.goto(served + "reference/cli/")
    widths = page.evaluate("""() => {
      const pres = [...document.querySelectorAll('.rst-content pre')];
      const wide = pres.filter(p => p.scrollWidth > p.clientWidth + 1);
      return {pres: pres.length, wide: wide.length,
              scrolling: wide.every(p => ['auto', 'scroll'].includes(getComputedStyle(p).overflowX)),
              page: document.documentElement.scrollWidth, view: window.innerWidth};
    }""")
    assert widths["pres"] > 10 and widths["scrolling"], widths
    assert widths["page"] <= widths["view"], f"the page itself scrolls sideways: {widths}"
    page.goto(served + "how-to/run-and-rerun/")
    tokens = page.locator(".highlight span[class]").count()
    assert tokens > 0, "no code highlighted by Pygments"
    assert page.outside == []
