"""The course website (``python3 course.py site``), built once per session from the repository:
every internal link and anchor resolves, every notebook has its page with all its figures, math is
rendered markup, widgets leave a note (never raw JSON), the reference pages and search are there,
and nothing is loaded from another host. (tests/browser/test_site.py opens it in Chromium.)"""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from authoring import site

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = site.numbered_notebooks()
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


class Page(HTMLParser):
    """What the checks need from one HTML file: its anchors, links, loaded resources and text."""

    SKIP_TEXT = {"script", "style", "pre", "code"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.ids: set[str] = set()
        self.links: list[str] = []  # href of <a> and <link>
        self.loads: list[tuple[str, str]] = []  # (tag, URL) the browser fetches: scripts, styles, images
        self.images: list[str] = []
        self.classes: list[str] = []
        self.text: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        for key in ("id", "name"):
            if a.get(key) and (key == "id" or tag == "a"):
                self.ids.add(a[key])
        self.classes += (a.get("class") or "").split()
        if tag in ("a", "link") and a.get("href") is not None:
            self.links.append(a["href"])
        if tag == "link" and "stylesheet" in (a.get("rel") or "") or tag in ("script", "img"):
            url = a.get("href") if tag == "link" else a.get("src")
            if url:
                self.loads.append((tag, url))
        if tag == "img" and a.get("src"):
            self.images.append(a["src"])
        if tag in self.SKIP_TEXT:
            self._skip += 1

    def handle_endtag(self, tag):
        if tag in self.SKIP_TEXT and self._skip:
            self._skip -= 1

    def handle_data(self, data):
        if not self._skip:
            self.text.append(data)


def parse(path: Path) -> Page:
    page = Page()
    page.feed(path.read_text(encoding="utf-8"))
    return page


@pytest.fixture(scope="module")
def pages(site_dir) -> dict[Path, Page]:
    """Every HTML page of the site (MathJax's own files excepted)."""
    return {p: parse(p) for p in sorted(site_dir.rglob("*.html")) if "_static" not in p.relative_to(site_dir).parts}


def is_internal(url: str) -> bool:
    parts = urlsplit(url)
    return not parts.scheme and not parts.netloc and not url.startswith(("mailto:", "javascript:"))


def resolve(site_dir: Path, page: Path, url: str) -> tuple[Path, str]:
    parts = urlsplit(url)
    target = (page.parent / unquote(parts.path)).resolve() if parts.path else page
    if target.is_dir():
        target = target / "index.html"
    return target, unquote(parts.fragment)


def notebook_page(site_dir: Path, nb: Path) -> Path:
    return site_dir / "notebooks" / f"{nb.stem}.html"


@pytest.mark.slow  # builds the site (Sphinx, about 10 s)
def test_the_build_has_a_page_for_every_notebook_and_the_reference_pages(site_dir):
    assert len(NOTEBOOKS) >= 11
    for nb in NOTEBOOKS:
        assert notebook_page(site_dir, nb).is_file(), f"no page for {nb.name}"
    for name in ("index", "glossary", "instructor_guide", "exercise_reference", "search"):
        assert (site_dir / f"{name}.html").is_file(), f"no {name}.html"
    # the Chinese edition: a page per Chinese notebook, its landing page, glossary and workshop material
    for nb in NOTEBOOKS:
        assert (site_dir / "notebooks" / "zh" / f"{nb.stem}.html").is_file(), f"no Chinese page for {nb.name}"
    for name in ("index", "glossary", "workshop"):
        assert (site_dir / "zh" / f"{name}.html").is_file(), f"no zh/{name}.html"
    assert [p.name for p in site_dir.parent.iterdir()] == [site_dir.name], "the build wrote next to its output"


@pytest.mark.slow  # builds the site (Sphinx, about 10 s)
def test_every_internal_link_and_anchor_resolves(site_dir, pages):
    broken, checked = [], 0
    for path, page in pages.items():
        for url in page.links + [u for _, u in page.loads]:
            if not is_internal(url) or url in ("", "#"):
                continue
            target, fragment = resolve(site_dir, path, url)
            checked += 1
            where = f"{path.relative_to(site_dir)} -> {url}"
            if not target.is_file():
                broken.append(f"{where}: no such file")
            elif fragment and target.suffix == ".html":
                ids = pages[target].ids if target in pages else parse(target).ids
                if fragment not in ids:
                    broken.append(f"{where}: no anchor #{fragment}")
    assert checked > 500, f"only {checked} internal links found: is the parser reading the pages?"
    assert not broken, "broken internal links:\n" + "\n".join(broken)


def test_the_link_checker_finds_a_broken_link_and_a_broken_anchor(tmp_path):
    (tmp_path / "a.html").write_text('<p id="here"></p><a href="b.html#nowhere">x</a><a href="c.html">y</a>')
    (tmp_path / "b.html").write_text('<h1 id="somewhere"></h1><a href="a.html#here">back</a>')
    a = parse(tmp_path / "a.html")
    results = []
    for url in a.links:
        target, fragment = resolve(tmp_path, tmp_path / "a.html", url)
        results.append((target.is_file(), fragment in parse(target).ids if target.is_file() else None))
    assert results == [(True, False), (False, None)]
    target, fragment = resolve(tmp_path, tmp_path / "b.html", parse(tmp_path / "b.html").links[0])
    assert target.is_file() and fragment in parse(target).ids


@pytest.mark.slow  # builds the site (Sphinx, about 10 s)
def test_the_landing_page_is_the_readme_with_every_notebook_linked(site_dir, pages):
    index = pages[site_dir / "index.html"]
    text = " ".join(index.text)
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    # the README's first paragraph, as it stands (after its language switch)
    story = next(p for p in readme.split("\n\n")[1:] if not p.startswith("**English**"))
    assert " ".join(story.split())[:120] in " ".join(text.split())
    linked = {resolve(site_dir, site_dir / "index.html", u)[0] for u in index.links if is_internal(u)}
    for nb in NOTEBOOKS:
        assert notebook_page(site_dir, nb).resolve() in linked, f"the landing page does not link {nb.stem}"


@pytest.mark.slow  # builds the site (Sphinx, about 10 s)
def test_notebook_pages_show_every_stored_figure_as_an_image_file(site_dir, pages):
    for nb in NOTEBOOKS:
        cells = json.loads(nb.read_text(encoding="utf-8"))["cells"]
        stored = sum("image/png" in o.get("data", {}) for c in cells for o in c.get("outputs", []))
        path = notebook_page(site_dir, nb)
        images = [resolve(site_dir, path, src)[0] for src in pages[path].images if is_internal(src)]
        figures = [p for p in images if p.parent.name == "_images"]
        assert len(figures) == stored, f"{nb.stem}: {stored} figures stored, {len(figures)} on the page"
        for p in figures:
            assert p.read_bytes()[:8] == PNG_MAGIC, f"{p} is not a PNG image"


@pytest.mark.slow  # builds the site (Sphinx, about 10 s)
def test_math_is_rendered_markup_never_raw_dollars(site_dir, pages):
    with_math = 0
    for nb in NOTEBOOKS:
        markdown = "".join(
            "".join(c["source"])
            for c in json.loads(nb.read_text(encoding="utf-8"))["cells"]
            if c["cell_type"] == "markdown"
        )
        page = pages[notebook_page(site_dir, nb)]
        blocks = markdown.count("$$") // 2
        assert page.classes.count("math") >= blocks, f"{nb.stem}: {blocks} display formulas, fewer math elements"
        with_math += blocks > 0
    assert with_math >= 2, "fewer than two notebooks have display math: choose other pages for this test"
    for path, page in pages.items():
        assert "$$" not in "".join(page.text), f"raw $$ on {path.relative_to(site_dir)}"
    mathjax = [u for p in pages.values() for t, u in p.loads if t == "script" and "mathjax" in u]
    assert mathjax and all(is_internal(u) for u in mathjax), "MathJax must be loaded from the site itself"
    assert (site_dir / "_static" / "mathjax" / "tex-chtml.js").is_file()
    assert list((site_dir / "_static" / "mathjax" / "output" / "chtml" / "fonts" / "woff-v2").glob("*.woff"))


@pytest.mark.slow  # builds the site (Sphinx, about 10 s)
def test_nothing_is_loaded_from_another_host(pages, site_dir):
    external = [
        f"{path.relative_to(site_dir)}: <{tag}> {url}"
        for path, page in pages.items()
        for tag, url in page.loads
        if not is_internal(url)
    ]
    assert not external, "the site must work offline:\n" + "\n".join(external)


@pytest.mark.slow  # builds the site (Sphinx, about 10 s)
def test_widgets_leave_a_note_never_raw_widget_data(site_dir, pages):
    """Every widget but a progress bar (tqdm's text reads "  0%|") leaves one note on the page."""
    for nb in NOTEBOOKS:
        cells = json.loads(nb.read_text(encoding="utf-8"))["cells"]
        views = [o["data"] for c in cells for o in c.get("outputs", []) if site.WIDGET_VIEW in o.get("data", {})]
        expected = sum(not re.search(r"\d+%\|", "".join(d.get("text/plain", ""))) for d in views)
        page = pages[notebook_page(site_dir, nb)]
        html = notebook_page(site_dir, nb).read_text(encoding="utf-8")
        assert "widget-view+json" not in html and "widget-state+json" not in html, nb.stem
        assert not re.search(r"\b[VH]Box\(children=", " ".join(page.text)), f"{nb.stem}: a widget's repr shows"
        assert "it/s]" not in " ".join(page.text), f"{nb.stem}: a progress bar's text shows"
        assert page.classes.count("widget-note") == expected, f"{nb.stem}: {expected} widgets, other number of notes"


@pytest.mark.slow  # builds the site (Sphinx, about 10 s)
def test_each_notebook_page_links_colab_and_its_student_edition(site_dir, pages):
    for nb in NOTEBOOKS:
        path = notebook_page(site_dir, nb)
        links = pages[path].links
        rel = nb.relative_to(ROOT).as_posix()
        assert site.colab_url_for(rel) in links, f"{nb.stem}: no Colab link"
        student = ROOT / "notebooks" / "student" / nb.name
        if not student.exists():
            continue
        assert site.colab_url_for(f"notebooks/student/{nb.name}") in links, (
            f"{nb.stem}: no Colab link to the student edition"
        )
        downloads = [resolve(site_dir, path, u)[0] for u in links if is_internal(u) and u.endswith("/" + nb.name)]
        assert any(p.read_bytes() == student.read_bytes() for p in downloads if p.is_file()), (
            f"{nb.stem}: no download of its student edition"
        )


@pytest.mark.slow  # builds the site (Sphinx, about 10 s)
def test_glossary_instructor_guide_and_exercise_reference_pages(site_dir, pages):
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = readme.split("<!-- glossary:start -->")[1].split("<!-- glossary:end -->")[0]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in block.strip().splitlines()[2:]]
    glossary = " ".join(pages[site_dir / "glossary.html"].text)
    assert len(rows) > 10
    for english, chinese, _ in rows:
        assert english in glossary and chinese in glossary, f"glossary page lacks {english} / {chinese}"
    guide = (ROOT / "docs" / "instructor_guide.md").read_text(encoding="utf-8")
    exercises = re.findall(r"^#### (Exercise \d+\.\d+)", guide, re.M)
    reference = " ".join(pages[site_dir / "exercise_reference.html"].text)
    assert exercises and all(e in reference for e in exercises)
    guide_text = " ".join(pages[site_dir / "instructor_guide.html"].text)
    for heading in re.findall(r"^## (.+)$", guide.split("## Exercise reference")[0], re.M):
        assert heading in guide_text, f"the instructor guide page lacks the section {heading!r}"


@pytest.mark.slow  # builds the site (Sphinx, about 10 s)
def test_search_index_holds_the_course_terms(site_dir):
    index = (site_dir / "searchindex.js").read_text(encoding="utf-8")
    for term in ("softmax", "kv", "causal", "注意力", "键值", "缓存"):  # Chinese: cut into words by jieba
        assert f'"{term}"' in index or json.dumps(term) in index, f"{term!r} is not in the search index"


@pytest.mark.slow  # builds the site (Sphinx, about 10 s)
def test_every_page_switches_to_its_other_language(site_dir, pages):
    english = pages[site_dir / "notebooks" / "05_masks_and_cross_attention.html"]
    chinese = pages[site_dir / "notebooks" / "zh" / "05_masks_and_cross_attention.html"]
    assert any(u.endswith("zh/05_masks_and_cross_attention.html") for u in english.links)
    assert any(u.endswith("../05_masks_and_cross_attention.html") for u in chinese.links)
    assert any(u.endswith("zh/index.html") for u in pages[site_dir / "index.html"].links)


def test_links_written_for_github_are_rewritten_for_the_site():
    colab = "https://colab.research.google.com/assets/colab-badge.svg"
    md = (
        f"[01](notebooks/01_x.ipynb) [s](notebooks/student/01_x.ipynb) [![Open In Colab]({colab})](https://c/01)"
        " [g](docs/instructor_guide.md#agendas) [a](docs/authoring.md) [web](https://example.org) [h](#here)"
        " [broken](notebooks/notebooks/01_x.ipynb)"
    )
    out = site.rewrite_links(md, "", "")
    repo = site.repository_url()
    assert out == (
        "[01](notebooks/01_x.ipynb) {download}`s <notebooks/student/01_x.ipynb>` [Open in Colab](https://c/01)"
        " [g](instructor_guide.md#agendas)"
        f" [a]({repo}/blob/main/docs/authoring.md) [web](https://example.org) [h](#here)"
        " [broken](notebooks/notebooks/01_x.ipynb)"  # left as it is: the link check reports it
    )
    in_a_notebook = site.rewrite_links("[s](student/01_x.ipynb)", "notebooks", "notebooks")
    assert in_a_notebook == "{download}`s <student/01_x.ipynb>`"


def _widget_output(model_id: str, plain: str) -> dict:
    data = {site.WIDGET_VIEW: {"model_id": model_id, "version_major": 2, "version_minor": 0}, "text/plain": plain}
    return {"output_type": "display_data", "data": data, "metadata": {}}


def test_a_new_notebooks_widgets_become_notes_and_its_progress_bars_go():
    """A notebook the site has never seen: an explorer (figure + controls), a progress bar and a
    quiz, as ipywidgets stores them."""
    model = lambda name, *children: {  # noqa: E731
        "model_name": name,
        "state": {"children": [f"IPY_MODEL_{c}" for c in children]},
    }
    state = {
        "e0": model("VBoxModel", "e1"),
        "e1": model("HBoxModel", "e2"),
        "e2": model("FloatSliderModel"),
        "p0": model("HBoxModel", "p1", "p2"),
        "p1": model("HTMLModel"),
        "p2": model("FloatProgressModel"),
        "q0": model("VBoxModel", "q1", "q2"),
        "q1": model("HTMLModel"),
        "q2": model("RadioButtonsModel"),
    }
    figure = {"output_type": "display_data", "data": {"image/png": "iVBORw0KGgo=", "text/plain": "<Figure>"}}
    badge = "[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab/x)"
    nb = {
        "cells": [
            {"cell_type": "markdown", "metadata": {}, "source": f"# 99 · New\n\n{badge}"},
            {"cell_type": "code", "metadata": {}, "source": "", "outputs": [figure, _widget_output("e0", "VBox(...)")]},
            {"cell_type": "code", "metadata": {}, "source": "", "outputs": [_widget_output("p0", "train: 0%| 0/9")]},
            {"cell_type": "code", "metadata": {}, "source": "", "outputs": [_widget_output("q0", "VBox(...)")]},
        ],
        "metadata": {"widgets": {site.WIDGET_STATE: {"state": state}}},
    }
    page = site.notebook_page(nb, "notebooks/99_new.ipynb", None)
    assert "widgets" not in page["metadata"] and "widgets" in nb["metadata"], "the original stays as it was"
    title = page["cells"][0]["source"]
    assert title == f"# 99 · New\n\n[Open in Colab]({site.colab_url_for('notebooks/99_new.ipynb')})"
    explorer, progress, quiz = (c["outputs"] for c in page["cells"][1:])
    assert explorer[0] == figure and "explorer" in explorer[1]["data"]["text/html"]
    assert progress == []
    assert len(quiz) == 1 and "answers interactively" in quiz[0]["data"]["text/html"]
    assert all('class="widget-note"' in out["data"]["text/html"] for out in (explorer[1], quiz[0]))


def test_a_finished_progress_bar_shows_its_final_text_and_a_first_frame_goes():
    """mha_course.kit.progress stores a finished bar as its final text: the page shows that text
    (no widget data); a bar stored as its first frame ("0%| 0/9") says nothing and goes."""
    state = {
        "p0": {"model_name": "HBoxModel", "state": {"children": ["IPY_MODEL_p1"]}},
        "p1": {"model_name": "FloatProgressModel", "state": {}},
    }
    finished, first_frame = "train: 100%|██████████| 9/9", "train:   0%|          | 0/9 [00:00<?, ?it/s]"
    nb = {
        "cells": [
            {"cell_type": "code", "metadata": {}, "source": "", "outputs": [_widget_output("p0", finished)]},
            {"cell_type": "code", "metadata": {}, "source": "", "outputs": [_widget_output("p0", first_frame)]},
            {"cell_type": "code", "metadata": {}, "source": "", "outputs": [_widget_output("zz", finished)]},
        ],
        "metadata": {"widgets": {site.WIDGET_STATE: {"state": state}}},
    }
    page = site.notebook_page(nb, "notebooks/99_new.ipynb", None)
    shown, gone, without_state = (c["outputs"] for c in page["cells"][1:])  # after the links cell
    assert shown == [{"output_type": "display_data", "data": {"text/plain": finished}, "metadata": {}}]
    assert gone == []
    assert without_state == shown, "recognised by its text when the widget state does not name it"


# --- the glossary's Chinese without a CJK system font; code within the page's width ---


def _bundled_fonts(folder: Path) -> dict[str, set[int]]:
    """Each font file under ``folder`` (name -> the code points its cmap covers)."""
    from fontTools.ttLib import TTFont

    return {p.name: set(TTFont(p).getBestCmap()) for p in sorted(folder.rglob("*.woff*"))}


def _tofu(characters: set[str], fonts: dict[str, set[int]]) -> str:
    """The characters no bundled font covers (they would render as boxes without a CJK system font)."""
    return "".join(sorted(ch for ch in characters if not any(ord(ch) in cmap for cmap in fonts.values())))


def _css_ranges(css: str) -> list[tuple[int, int]]:
    (face,) = re.findall(r'@font-face\s*{[^}]*"Course CJK"[^}]*}', css)
    (ranges,) = re.findall(r"unicode-range:\s*([^;]+);", face)
    return [tuple(int(x, 16) for x in (r.strip()[2:].split("-") * 2)[:2]) for r in ranges.split(",")]


def test_the_tofu_test_finds_a_character_the_font_lacks():
    fonts = _bundled_fonts(site.CJK_FONT.parent)
    assert fonts, "no font in docs/site/_static/fonts"
    assert _tofu({"注", "意", "力"}, fonts) == ""
    assert _tofu({"注", "龍"}, fonts) == "龍", "a character outside the subset must be reported"


def test_the_fonts_unicode_range_is_what_the_site_calls_cjk():
    css = (site.CONF_DIR / "_static" / "course.css").read_text(encoding="utf-8")
    assert _css_ranges(css) == list(site.CJK_RANGES)
    # a subset to the site's characters (the Chinese edition's few thousand), not the whole font (16 MB)
    assert site.CJK_FONT.stat().st_size < 3_000_000
    licence = (site.CJK_FONT.parent / "LICENSE.txt").read_text(encoding="utf-8")
    assert "SIL OPEN FONT LICENSE Version 1.1" in licence


@pytest.mark.slow  # builds the site (Sphinx, about 10 s)
def test_every_cjk_character_on_the_site_is_covered_by_a_bundled_font(site_dir, pages):
    characters = set().union(*(site.cjk_characters(" ".join(page.text)) for page in pages.values()))
    glossary = " ".join(pages[site_dir / "glossary.html"].text)
    assert {"注", "意", "力"} <= site.cjk_characters(glossary), "the glossary's Chinese is on the site"
    fonts = _bundled_fonts(site_dir / "_static" / "fonts")  # the theme's icon fonts hold no CJK
    assert "cjk-subset.woff" in fonts, "the subset is shipped with the site"
    missing = _tofu(characters, fonts)
    assert not missing, (
        f"{missing}: on the site but in no bundled font (boxes without a CJK font): run "
        "`python -m authoring.site --cjk-font /usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc` "
        "(Debian's fonts-noto-cjk) and commit docs/site/_static/fonts/cjk-subset.woff"
    )
    css = (site_dir / "_static" / "course.css").read_text(encoding="utf-8")
    ranges = _css_ranges(css)
    assert all(any(lo <= ord(ch) <= hi for lo, hi in ranges) for ch in characters), "unicode-range misses some"


def test_code_and_outputs_wrap_at_the_page_width():
    css = re.sub(r"/\*.*?\*/", "", (site.CONF_DIR / "_static" / "course.css").read_text(encoding="utf-8"), flags=re.S)
    rule = re.search(r"([^{}]*){\s*white-space:\s*pre-wrap;[^}]*overflow-wrap:\s*anywhere;", css)
    assert rule, "course.css must wrap long code lines"
    selectors = {s.strip() for s in rule[1].split(",")}
    assert {"div.highlight pre", "div.cell_output pre"} <= selectors, selectors
