"""The course website in a real (headless) Chromium, with no network but the site itself (the
built site itself is checked without a browser in tests/test_site.py).

The site is built once per session (the ``site_dir`` fixture, tests/conftest.py) and served on
127.0.0.1; every request to any other address is refused and recorded. The landing page and two
notebook pages with display math (01 and 06) must load with no console error and no refused
request, show every image (naturalWidth > 0) and render every formula with the bundled MathJax
(``mjx-container`` elements, no raw ``$$`` in the text); the search page must find "softmax".

Screenshots go to tests/browser/screenshots/site/ (git-ignored): each page at the top, each
notebook page at its first formula, and the search results.
"""

from __future__ import annotations

import functools
import http.server
import shutil
import threading
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

SCREENSHOTS = Path(__file__).resolve().parent / "screenshots"  # git-ignored
PAGES = ("index.html", "notebooks/01_single_head_attention.html", "notebooks/06_gqa_mqa_and_kv_cache.html")
TIMEOUT_MS = 60_000  # one page on a loaded 2-core machine

MATH_DONE_JS = """async () => {
  if (!window.MathJax || !MathJax.startup) return -1;
  await MathJax.startup.promise;
  return document.querySelectorAll('mjx-container').length;
}"""
IMAGES_JS = """() => [...document.images].map(i => ({src: i.src, complete: i.complete, width: i.naturalWidth}))"""


class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # the test reports what matters
        pass


@pytest.fixture(scope="module")
def server(site_dir, chromium_executable):
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(site_dir)))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(scope="module")
def site_screenshots() -> Path:
    folder = SCREENSHOTS / "site"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


@pytest.fixture
def offline_page(browser, server):
    """A page that may reach only the local server; yields (page, console errors, refused URLs)."""
    context = browser.new_context(viewport={"width": 1280, "height": 900}, service_workers="block")
    refused: list[str] = []

    def route(r):
        if r.request.url.startswith(server + "/"):
            r.continue_()
        else:
            refused.append(r.request.url)
            r.abort("internetdisconnected")

    context.route("**/*", route)
    page = context.new_page()
    errors: list[str] = []
    page.on("console", lambda m: errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
    yield page, errors, refused
    context.close()


@pytest.mark.parametrize("path", PAGES)
def test_page_renders_offline(path, server, offline_page, site_dir, site_screenshots):
    page, errors, refused = offline_page
    page.goto(f"{server}/{path}", wait_until="load", timeout=TIMEOUT_MS)
    name = Path(path).stem
    page.screenshot(path=site_screenshots / f"{name}.png")

    math_elements = page.locator(".math").count()
    if path != "index.html":
        assert math_elements > 0, f"{path}: no formula on the page (the test should open pages with math)"
    if math_elements:
        rendered = page.evaluate(MATH_DONE_JS)
        assert rendered >= math_elements, f"{path}: {math_elements} formulas, {rendered} rendered by MathJax"
        page.locator("mjx-container").first.scroll_into_view_if_needed()
        page.screenshot(path=site_screenshots / f"{name}-math.png")
    assert "$$" not in page.inner_text("body"), f"{path}: raw $$ in the text"

    page.wait_for_function("() => [...document.images].every(i => i.complete)", timeout=TIMEOUT_MS)
    images = page.evaluate(IMAGES_JS)
    broken = [i["src"] for i in images if i["width"] == 0]
    assert not broken, f"{path}: images that did not load: {broken}"
    if path != "index.html":
        stored = len(list((site_dir / "_images").glob("*.png")))
        figures = [i for i in images if "/_images/" in i["src"]]
        assert figures and stored, f"{path}: no figure on the page"

    assert not refused, f"{path} tried to reach the network: {refused}"
    assert not errors, f"{path}: " + "\n".join(errors)


def test_search_finds_a_course_term_offline(server, offline_page, site_screenshots):
    page, errors, refused = offline_page
    page.goto(f"{server}/search.html?q=softmax", wait_until="load", timeout=TIMEOUT_MS)
    results = page.locator("ul.search li")
    results.first.wait_for(timeout=TIMEOUT_MS)
    page.screenshot(path=site_screenshots / "search-softmax.png")
    links = [a.get_attribute("href") for a in page.locator("ul.search li a").all()]
    assert any("notebooks/01_single_head_attention" in (h or "") for h in links), links
    assert not refused, f"search tried to reach the network: {refused}"
    assert not errors, "\n".join(errors)
