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
PAGES = (
    "index.html",
    "notebooks/01_single_head_attention.html",
    "notebooks/06_gqa_mqa_and_kv_cache.html",
    "notebooks/zh/01_single_head_attention.html",  # the Chinese edition: its figures label in Chinese
)
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
    if "/zh/" in f"/{path}":
        assert "注意力" in page.inner_text("body"), f"{path}: the Chinese page shows no Chinese"
        assert page.evaluate(FONT_STATUS_JS) == ["loaded"], f"{path}: the bundled CJK font was not used"
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


@pytest.mark.parametrize(
    "term, found",
    [("softmax", "notebooks/01_single_head_attention"), ("通讯录", "notebooks/zh/01_single_head_attention")],
)
def test_search_finds_a_course_term_offline(term, found, server, offline_page, site_screenshots):
    """An English term, and a Chinese word (the Chinese pages are cut into words by jieba)."""
    page, errors, refused = offline_page
    page.goto(f"{server}/search.html?q={term}", wait_until="load", timeout=TIMEOUT_MS)
    results = page.locator("ul.search li")
    results.first.wait_for(timeout=TIMEOUT_MS)
    # the results are listed one by one: read them once the search says it has finished
    page.locator("p.search-summary", has_text="Search finished").wait_for(timeout=TIMEOUT_MS)
    page.screenshot(path=site_screenshots / f"search-{'zh' if '/zh/' in found else term}.png")
    links = [a.get_attribute("href") for a in page.locator("ul.search li a").all()]
    assert any(found in (h or "") for h in links), links
    assert not refused, f"search tried to reach the network: {refused}"
    assert not errors, "\n".join(errors)


#: pages with the longest code lines: the landing page's Quickstart, and notebooks 11 and 12
WIDE_PAGES = ("index.html", "notebooks/11_positions_and_rope.html", "notebooks/12_beyond_gqa.html")
OVERFLOW_JS = """() => [...document.querySelectorAll('div.highlight pre, div.cell_output pre, div.output pre')]
  .filter(e => e.scrollWidth > e.clientWidth + 1)
  .map(e => `${e.scrollWidth} > ${e.clientWidth}: ${e.textContent.trim().slice(0, 60)}`)"""
FONT_STATUS_JS = """async () => {
  await document.fonts.ready;
  return [...document.fonts].filter(f => f.family.replace(/["']/g, '') === 'Course CJK').map(f => f.status);
}"""


@pytest.mark.parametrize("path", WIDE_PAGES)
def test_code_stays_within_the_page_width(path, server, offline_page, site_screenshots):
    """At the default width (1280 px) no code cell, output or README block scrolls sideways."""
    page, errors, refused = offline_page
    page.goto(f"{server}/{path}", wait_until="load", timeout=TIMEOUT_MS)
    blocks = page.locator("div.highlight pre")
    assert blocks.count() > 0, f"{path}: no code on the page"
    overflowing = page.evaluate(OVERFLOW_JS)
    assert not overflowing, f"{path}: code wider than the page:\n" + "\n".join(overflowing)
    widest = page.evaluate(
        "() => { const b = [...document.querySelectorAll('div.highlight pre')];"
        " const w = b.reduce((a, e) => Math.max(a, ...e.textContent.split('\\n').map(l => l.length)), 0);"
        " return b.findIndex(e => e.textContent.split('\\n').some(l => l.length === w)); }"
    )
    blocks.nth(widest).scroll_into_view_if_needed()
    page.screenshot(path=site_screenshots / f"{Path(path).stem}-widest-code.png")
    assert not refused and not errors, f"{path}: {refused} {errors}"


@pytest.mark.parametrize("path", ["glossary.html", "zh/glossary.html"])
def test_the_glossarys_chinese_renders_with_the_bundled_font(path, server, offline_page, site_screenshots):
    """The Chinese column (and the Chinese glossary page) is drawn with the site's own CJK subset
    (loaded, as the page needs it), so it reads on a machine without a CJK font."""
    page, errors, refused = offline_page
    page.goto(f"{server}/{path}", wait_until="load", timeout=TIMEOUT_MS)
    cell = page.locator("td", has_text="注意力").first
    cell.scroll_into_view_if_needed()
    assert page.evaluate(FONT_STATUS_JS) == ["loaded"], "the bundled CJK font was not used"
    assert page.evaluate("() => document.fonts.check('16px \"Course CJK\"', '注意力头')")
    page.screenshot(path=site_screenshots / f"{path.replace('/', '-')[:-5]}.png")
    assert not refused and not errors, f"{refused} {errors}"
