"""The course website: a static site built from the committed, executed notebooks.

    python -m authoring.site [OUT]    build the site into OUT (default: _site/ at the repository root)
    python3 course.py site            the same, after installing the `site` extra into .venv/
    python -m authoring.site --cjk-font PATH   remake docs/site/_static/fonts/cjk-subset.woff from a
                                      CJK font (after adding Chinese text; needs no network)

Sphinx with MyST-NB renders what the notebooks store; nothing is executed (the configuration is
docs/site/conf.py). Before the build this module writes a staging copy of the pages:

* ``index.md``: README.md (the course's story, quickstart and course map), its links rewritten for
  the site, its glossary moved to ``glossary.md``;
* ``notebooks/NN_*.ipynb``: every numbered notebook (new ones are picked up by their name), with
  text links to Colab and to the student edition instead of the Colab badge image (the site works
  offline, so it loads nothing from elsewhere) and, in place of each widget, a note that the
  controls need a running kernel (the static figure before it stays); a finished progress bar shows
  its final text, one stored as its first frame is dropped;
* ``notebooks/student/``: the student edition, offered as downloads;
* ``instructor_guide.md`` and ``exercise_reference.md``: docs/instructor_guide.md, split where its
  generated exercise reference begins.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

from authoring.notebooks import BADGE_RE, ROOT, colab_url_for, numbered_notebooks, repository

CONF_DIR = ROOT / "docs" / "site"
DEFAULT_OUT = ROOT / "_site"
#: the Chinese of the glossary, for machines without a CJK font: a subset of Noto Sans CJK SC (SIL
#: Open Font License 1.1) to exactly the CJK characters the site uses, made by ``--cjk-font``
CJK_FONT = CONF_DIR / "_static" / "fonts" / "cjk-subset.woff"
#: what counts as CJK here (and the unicode-range of course.css's @font-face, which must agree):
#: radicals, CJK punctuation, kana, ideographs (and extension A), compatibility ideographs,
#: Hangul syllables, full-width forms such as （ ）
CJK_RANGES = (
    (0x2E80, 0x2FDF),
    (0x3000, 0x30FF),
    (0x3400, 0x4DBF),
    (0x4E00, 0x9FFF),
    (0xAC00, 0xD7AF),
    (0xF900, 0xFAFF),
    (0xFF00, 0xFFEF),
)

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
#: a tqdm bar's text: "desc:  40%|████      | 2/5 ..." (first frame, timing, or the final text)
PROGRESS_RE = re.compile(r"\d{1,3}%\|[^|\n]*\| *[\d.]+\w?/[\d.]+\w?")
#: a bar's stored final text (mha_course.kit.progress): the count and nothing after it
FINISHED_RE = re.compile(r"\| *(?P<n>[\d.]+\w?)/(?P<total>[\d.]+\w?)\s*$")
LINK_RE = re.compile(r"(?<!!)\[([^\]]*)\]\(([^)\s]+)\)")
EXERCISE_REFERENCE = "## Exercise reference (generated)"


def repository_url() -> str:
    """``https://github.com/OWNER/REPO``: pyproject's ``[project.urls] Repository``."""
    owner, repo = repository()
    return f"https://github.com/{owner}/{repo}"


# ---------------------------------------------------------------- links in Markdown


def _badge_target(badge: re.Match) -> str:
    """Where a Colab badge ``[![Open In Colab](image)](target)`` links to."""
    return badge.group(0).rsplit("](", 1)[1][:-1]


def _download(text: str, target: str) -> str:
    return f"{{download}}`{text} <{target}>`"


def rewrite_links(markdown: str, source_dir: str, page_dir: str) -> str:
    """Links written for GitHub (relative to ``source_dir`` in the repository) made right for a page
    in ``page_dir`` of the site: notebooks link to their pages, the student edition to downloads,
    the instructor guide to its page, anything else in the repository to GitHub; the Colab badge
    image becomes a text link."""
    markdown = BADGE_RE.sub(lambda m: f"[Open in Colab]({_badge_target(m)})", markdown)
    site_paths = {
        "docs/instructor_guide.md": "instructor_guide.md",
        "docs/workshop.zh-CN.md": "zh/workshop.md",
        "README.zh-CN.md": "zh/index.md",
        "README.md": "index.md",
    }

    def one(m: re.Match) -> str:
        text, target = m.group(1), m.group(2)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("#"):
            return m.group(0)
        path, _, anchor = target.partition("#")
        rel = os.path.normpath(os.path.join(source_dir, path)).replace(os.sep, "/")
        here = lambda p: os.path.relpath(p, page_dir or ".").replace(os.sep, "/")  # noqa: E731
        if re.fullmatch(r"notebooks/student/(zh/)?\d\d_[^/]+\.ipynb", rel):
            return _download(text, here(rel))
        if re.fullmatch(r"notebooks/(zh/)?\d\d_[^/]+\.ipynb", rel):
            return f"[{text}]({here(rel)}{'#' + anchor if anchor else ''})"
        if rel in site_paths:
            return f"[{text}]({here(site_paths[rel])}{'#' + anchor if anchor else ''})"
        if not (ROOT / rel).exists():
            return m.group(0)  # broken already: left for the link check to report
        return f"[{text}]({repository_url()}/blob/main/{rel}{'#' + anchor if anchor else ''})"

    return LINK_RE.sub(one, markdown)


def _split_section(markdown: str, heading: str) -> tuple[str, str, str]:
    """(before, section, after) around the level-2 section that starts with ``heading``."""
    start = markdown.index(heading)
    nxt = re.search(r"^## ", markdown[start + len(heading) :], re.M)
    end = start + len(heading) + nxt.start() if nxt else len(markdown)
    return markdown[:start], markdown[start:end], markdown[end:]


# ---------------------------------------------------------------- pages


#: the language switch at the top of the landing pages (the notebooks' pages carry theirs by their
#: Colab link): English -> its Chinese twin, Chinese -> its English source
SWITCH = {"en": "**English** · [简体中文]({zh})", "zh": "[English]({en}) · **简体中文**"}


def landing_page(readme: str, notebooks: list[str], *, lang: str = "en") -> tuple[str, str]:
    """(index.md, glossary.md) from README.md (``lang="zh"``: README.zh-CN.md, for zh/): the landing
    page keeps the story, the quickstart and the course map; the glossary gets a page of its own."""
    heading = "## Glossary" if lang == "en" else "## 术语表"
    before, glossary, after = _split_section(readme, heading)
    title = glossary.splitlines()[0].lstrip("# ").strip()
    glossary_page = "# " + title + "\n" + glossary.split("\n", 1)[1]
    pointer = (
        f"## {title}\n\nThe course's English–Chinese glossary has a page of its own: [{title}](glossary.md).\n\n"
        if lang == "en"
        else f"## {title}\n\n课程的英中术语表单独成页：[{title}](glossary.md)。\n\n"
    )
    source_dir = ""
    page_dir = "" if lang == "en" else "zh"
    before = re.sub(
        r"^(\*\*English\*\* · \[简体中文\]\(README\.zh-CN\.md\)|\[English\]\(README\.md\) · \*\*简体中文\*\*)\n+",
        "",
        before,
        flags=re.M,
    )  # the site has its own switch
    index = rewrite_links(before, source_dir, page_dir) + pointer + rewrite_links(after, source_dir, page_dir)
    first, _, rest = index.partition("\n")
    switch = SWITCH[lang].format(zh="zh/index.md", en="../index.md")
    index = f"{first}\n\n{switch}\n{rest}"
    if lang == "en":
        toc = "\n".join(f"notebooks/{Path(n).stem}" for n in notebooks)
        index += (
            f"\n```{{toctree}}\n:hidden:\n:caption: Notebooks\n\n{toc}\n```\n\n"
            "```{toctree}\n:hidden:\n:caption: Reference\n\nglossary\ninstructor_guide\nexercise_reference\n```\n\n"
            "```{toctree}\n:hidden:\n:caption: 简体中文\n\nzh/index\n```\n"
        )
    else:
        toc = "\n".join(f"../notebooks/zh/{Path(n).stem}" for n in notebooks)
        index += (
            f"\n```{{toctree}}\n:hidden:\n:caption: 笔记本\n\n{toc}\n```\n\n"
            "```{toctree}\n:hidden:\n:caption: 参考\n\nglossary\nworkshop\n```\n"
        )
    return index, rewrite_links(glossary_page, source_dir, page_dir)


def guide_pages(guide: str) -> tuple[str, str]:
    """(instructor_guide.md, exercise_reference.md): the generated reference becomes its own page
    (its headings raised by two levels), and the guide links to it."""
    before, reference, after = _split_section(guide, EXERCISE_REFERENCE)
    before = before.replace("](#exercise-reference-generated)", "](exercise_reference.md)")
    lines = reference.splitlines()
    lines[0] = "# Exercise reference"
    fence = False
    for i, line in enumerate(lines[1:], 1):
        if line.startswith("```"):
            fence = not fence
        elif not fence and re.match(r"^#{3,6} ", line):
            lines[i] = line[2:]
    return rewrite_links(before + after, "docs", ""), rewrite_links("\n".join(lines) + "\n", "docs", "")


def _models_below(state: dict, model_id: str) -> set[str]:
    """Model names of a widget and every widget it contains (from the notebook's widget state)."""
    names, todo, seen = set(), [model_id], set()
    while todo:
        mid = todo.pop()
        if mid in seen or mid not in state:
            continue
        seen.add(mid)
        names.add(state[mid].get("model_name", ""))
        todo += re.findall(r"IPY_MODEL_(\w+)", json.dumps(state[mid].get("state", {})))
    return names


def _widget_note(kind: str, colab: str) -> dict:
    what = {
        "explorer": "The controls of this explorer redraw the figure above when the notebook runs in a kernel",
        "interactive": "This part answers interactively when the notebook runs in a kernel",
    }[kind]
    html = (
        f'<p class="widget-note">{what}: open it in JupyterLab (<code>python3 course.py lab</code>) '
        f'or <a href="{colab}">in Colab</a>.</p>'
    )
    return {"output_type": "display_data", "data": {"text/html": html, "text/plain": what}, "metadata": {}}


def notebook_page(nb: dict, rel: str, student_rel: str | None) -> dict:
    """A copy of the notebook ``nb`` (at repository path ``rel``) ready for the site."""
    nb = copy.deepcopy(nb)
    state = nb.get("metadata", {}).pop("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    page_dir = os.path.dirname(rel)
    zh = page_dir.endswith("zh")
    links = f"[{'在 Colab 中打开' if zh else 'Open in Colab'}]({colab_url_for(rel)})"
    if student_rel:
        student = os.path.relpath(student_rel, page_dir).replace(os.sep, "/")
        if zh:
            links += (
                f" · 学生版（练习留给你完成）：{_download('下载笔记本', student)}"
                f"或[在 Colab 中打开]({colab_url_for(student_rel)})"
            )
        else:
            links += (
                f" · student edition (exercises to fill in): {_download('download the notebook', student)}"
                f" or [open it in Colab]({colab_url_for(student_rel)})"
            )
    twin = f"notebooks/zh/{Path(rel).name}" if not zh else f"notebooks/{Path(rel).name}"
    if (ROOT / twin).exists():  # the language switch: the page of the same notebook in the other language
        target = os.path.relpath(twin, page_dir).replace(os.sep, "/")
        links += f" · [English]({target})" if zh else f" · [简体中文]({target})"
    badge_replaced = False
    for cell in nb["cells"]:
        source = "".join(cell["source"])
        if cell["cell_type"] == "markdown":
            if not badge_replaced and BADGE_RE.search(source):
                source = BADGE_RE.sub(lambda m: links, source, count=1)
                badge_replaced = True
            cell["source"] = rewrite_links(source, page_dir, page_dir)
        if cell["cell_type"] != "code":
            continue
        outputs = []
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if "text/markdown" in data:  # Markdown a cell displays links like the notebook's own text
                data["text/markdown"] = rewrite_links("".join(data["text/markdown"]), page_dir, page_dir)
            view = data.get(WIDGET_VIEW)
            if view is None:
                outputs.append(out)
                continue
            names = _models_below(state, view.get("model_id", ""))
            plain = "".join(out["data"].get("text/plain", ""))
            if names & {"FloatProgressModel", "IntProgressModel"} or "it/s]" in plain or PROGRESS_RE.search(plain):
                finished = FINISHED_RE.search(plain)
                if finished and finished["n"] == finished["total"]:  # the bar's final text, as text
                    outputs.append({"output_type": "display_data", "data": {"text/plain": plain}, "metadata": {}})
                continue  # a bar stored as its first frame says nothing on a page
            # an explorer shows its static figure first; a quiz, a prediction or a hint ladder its text
            after_figure = bool(outputs) and "image/png" in outputs[-1].get("data", {})
            outputs.append(_widget_note("explorer" if after_figure else "interactive", colab_url_for(rel)))
        cell["outputs"] = outputs
    if not badge_replaced:  # no badge in the notebook: the links go first
        nb["cells"].insert(0, {"cell_type": "markdown", "metadata": {}, "source": links})
    return nb


def stage(src: Path) -> list[str]:
    """Write the site's source pages into ``src``; return the notebooks' repository paths."""
    notebooks = [p.relative_to(ROOT).as_posix() for p in numbered_notebooks()]
    chinese = [p.relative_to(ROOT).as_posix() for p in sorted((ROOT / "notebooks" / "zh").glob("[0-9][0-9]_*.ipynb"))]
    (src / "notebooks" / "student" / "zh").mkdir(parents=True)
    (src / "notebooks" / "zh").mkdir(parents=True)
    (src / "zh").mkdir()
    for rel in notebooks + chinese:
        student_rel = f"{os.path.dirname(rel).replace('notebooks', 'notebooks/student', 1)}/{Path(rel).name}"
        has_student = (ROOT / student_rel).exists()
        if has_student:
            shutil.copy2(ROOT / student_rel, src / student_rel)
        nb = json.loads((ROOT / rel).read_text(encoding="utf-8"))
        page = notebook_page(nb, rel, student_rel if has_student else None)
        (src / rel).write_text(json.dumps(page, ensure_ascii=False, indent=1), encoding="utf-8")
    index, glossary = landing_page((ROOT / "README.md").read_text(encoding="utf-8"), notebooks)
    (src / "index.md").write_text(index, encoding="utf-8")
    (src / "glossary.md").write_text(glossary, encoding="utf-8")
    guide, reference = guide_pages((ROOT / "docs" / "instructor_guide.md").read_text(encoding="utf-8"))
    (src / "instructor_guide.md").write_text(guide, encoding="utf-8")
    (src / "exercise_reference.md").write_text(reference, encoding="utf-8")
    if chinese and (ROOT / "README.zh-CN.md").exists():  # the Chinese edition: zh/ and notebooks/zh/
        index, glossary = landing_page((ROOT / "README.zh-CN.md").read_text(encoding="utf-8"), chinese, lang="zh")
        (src / "zh" / "index.md").write_text(index, encoding="utf-8")
        (src / "zh" / "glossary.md").write_text(glossary, encoding="utf-8")
        workshop = (ROOT / "docs" / "workshop.zh-CN.md").read_text(encoding="utf-8")
        workshop = re.sub(r"^\[English\]\(instructor_guide\.md\) \| 简体中文\n+", "", workshop)
        (src / "zh" / "workshop.md").write_text(rewrite_links(workshop, "docs", "zh"), encoding="utf-8")
    return notebooks + chinese


def build(out: Path = DEFAULT_OUT, *, quiet: bool = True) -> Path:
    """Build the site into ``out`` (replaced); warnings fail the build. Returns ``out``."""
    from sphinx.cmd.build import build_main

    out = Path(out).resolve()
    with tempfile.TemporaryDirectory(prefix="mha-site-") as tmp:
        # everything Sphinx and MyST-NB write (they put files next to the output folder too) stays
        # in the temporary folder; `out` is replaced only by a finished site
        src, html = Path(tmp) / "src", Path(tmp) / "html"
        stage(src)
        args = ["-b", "html", "-c", str(CONF_DIR), "-d", str(Path(tmp) / "doctrees"), "-W", "--keep-going"]
        args += ["-q"] if quiet else []
        status = build_main([*args, str(src), str(html)])
        if status:
            raise SystemExit(f"the site build failed (sphinx-build exit status {status}); see the messages above")
        prune_mathjax(html / "_static" / "mathjax")
        (html / ".nojekyll").write_text("")  # GitHub Pages: serve _static/ and friends as they are
        if out.exists():
            shutil.rmtree(out)
        shutil.move(html, out)
    return out


def prune_mathjax(folder: Path) -> None:
    """Keep what the pages load (``tex-chtml.js``), its fonts, the TeX extensions it may load on
    demand and the accessibility parts of its menu; drop MathJax's other bundles (SVG output,
    MathML input), a third of the site's size."""
    keep = ("tex-chtml.js", "output/chtml", "input/tex/extensions", "a11y", "sre", "ui")
    for path in sorted(folder.rglob("*"), reverse=True):
        rel = path.relative_to(folder).as_posix()
        if path.is_file() and not rel.startswith(keep):
            path.unlink()
        elif path.is_dir() and not any(path.iterdir()):
            path.rmdir()


def cjk_characters(text: str) -> set[str]:
    """The characters of ``text`` in CJK_RANGES."""
    return {ch for ch in set(text) if any(lo <= ord(ch) <= hi for lo, hi in CJK_RANGES)}


def staged_cjk_characters() -> set[str]:
    """Every CJK character of the site's source pages (as staged: README, notebooks, guide)."""
    with tempfile.TemporaryDirectory(prefix="mha-site-") as tmp:
        stage(Path(tmp))
        return set().union(*(cjk_characters(p.read_text(encoding="utf-8")) for p in Path(tmp).rglob("*.*")))


def make_cjk_font(
    source: Path, out: Path = CJK_FONT, *, characters: set[str] | None = None, flavor: str | None = "woff"
) -> tuple[set[str], int]:
    """Subset the CJK font ``source`` (e.g. Debian's fonts-noto-cjk NotoSansCJK-Regular.ttc; in a
    collection, its Simplified Chinese member) to the characters of :func:`staged_cjk_characters`,
    as WOFF, into ``out``; its copyright and licence names stay in the font. Returns (the
    characters, the file's size). An authoring step: the result is committed, CI needs no CJK font."""
    from fontTools import subset
    from fontTools.ttLib import TTCollection, TTFont

    source = Path(source)
    number = 0
    if source.suffix.lower() in (".ttc", ".otc"):
        names = [f["name"].getDebugName(1) or "" for f in TTCollection(source).fonts]
        number = next((i for i, n in enumerate(names) if n.endswith(" SC") and "Mono" not in n), 0)
    font = TTFont(source, fontNumber=number)
    characters = staged_cjk_characters() if characters is None else characters
    missing = sorted(ch for ch in characters if ord(ch) not in font.getBestCmap())
    if missing:
        raise SystemExit(f"{source} lacks {''.join(missing)}: choose a font that covers them")
    options = subset.Options()
    options.flavor = flavor  # woff: zlib, fontTools needs no brotli for it, and every browser reads it
    options.layout_features = []  # isolated glossary terms: no ligatures or vertical forms needed
    options.hinting = False
    options.name_IDs = [0, 1, 2, 3, 4, 5, 6, 13, 14]  # copyright, names, licence and its URL
    options.name_languages = [0x409]
    subsetter = subset.Subsetter(options)
    subsetter.populate(unicodes=sorted(ord(ch) for ch in characters))
    subsetter.subset(font)
    out.parent.mkdir(parents=True, exist_ok=True)
    font.flavor = flavor
    font.save(out)
    return characters, out.stat().st_size


def site_size(out: Path) -> int:
    return sum(p.stat().st_size for p in out.rglob("*") if p.is_file())


def main(argv: list[str]) -> int:
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    if argv and argv[0] == "--cjk-font":
        if len(argv) != 2:
            print("usage: python -m authoring.site --cjk-font PATH (e.g. Debian's fonts-noto-cjk")
            print("       /usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc)")
            return 2
        characters, size = make_cjk_font(Path(argv[1]))
        print(f"{CJK_FONT.relative_to(ROOT)}: {len(characters)} characters, {size:,} bytes")
        return 0
    out = Path(argv[0]) if argv else DEFAULT_OUT
    start = time.perf_counter()
    build(out)
    seconds = time.perf_counter() - start
    print(f"site built in {seconds:.0f} s: {out} ({site_size(out) / 1e6:.1f} MB); open {out / 'index.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
