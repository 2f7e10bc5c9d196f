"""The Chinese edition: gettext catalogues kept in step with the English source, and the Chinese
notebooks built from both.

    python -m authoring translate --update        bring the catalogues up to date with the English
                                                  (new texts empty, changed ones fuzzy, as msgmerge)
    python -m authoring translate --check         exit 1 naming every text whose translation is
                                                  missing or fuzzy (the test suite runs this)
    python -m authoring translate --build [NN …]  write notebooks/zh/NN_*.ipynb from the English
                                                  notebooks and the catalogues (then execute them)
    python -m authoring translate --stats         entries and words of each catalogue
    python -m authoring translate --font PATH     remake the figures' CJK font (a subset of PATH, e.g.
                                                  /usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc)
    python -m authoring translate --lint [NN …]   what the translations changed that they must keep
                                                  (numbers, formulas, code, links, structure, terms,
                                                  Chinese typography by autocorrect)

The catalogues (``mha_course/locale/zh/``, see mha_course/i18n.py) are standard gettext ``.po``
files, read and written with polib: each entry's msgid is the English, its msgctxt names the
notebook cell (by its id), quiz option, hint rung or package message it belongs to, and its
occurrence the file. Poedit, Weblate and ``msgfmt --check`` read them. A translator edits the
msgstr; ``--update`` marks an entry fuzzy (keeping the old English as ``#| msgid``) when its English
changes, and ``--check`` fails until the translation is reviewed and the fuzzy flag removed.
"""

from __future__ import annotations

import argparse
import ast
import copy
import json
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from . import notebooks as notebook_tools

ROOT = notebook_tools.ROOT
LANG = "zh"
LOCALE = ROOT / "mha_course" / "locale" / LANG
ZH_DIR = notebook_tools.NOTEBOOKS / LANG
ZH_REL = f"notebooks/{LANG}"
#: the catalogue header (gettext's standard fields)
METADATA = {
    "Project-Id-Version": "mha-course",
    "Language": "zh_CN",
    "MIME-Version": "1.0",
    "Content-Type": "text/plain; charset=UTF-8",
    "Content-Transfer-Encoding": "8bit",
    "Plural-Forms": "nplurals=1; plural=0;",
}


@dataclass(frozen=True)
class Source:
    """One English text to translate: ``context`` (msgctxt), ``text`` (msgid), ``where`` (the
    occurrence: a repo-relative file), ``note`` (a comment for the translator)."""

    context: str
    text: str
    where: str
    note: str = ""


# ---------------------------------------------------------------------------------------------
# the English source


def markdown_source(cell) -> str:
    """A Markdown cell's text as translated: its Colab badge (rewritten per edition) left out."""
    text = notebook_tools._source(cell)
    return notebook_tools.BADGE_RE.sub("", text).rstrip()


def notebook_sources(path: Path) -> list[Source]:
    """The translatable texts of notebook ``path``: every Markdown cell (context "<stem> cell <id>"),
    then its quiz, predictions and hint ladders (mha_course.i18n.data_fields)."""
    import nbformat

    from mha_course import i18n

    nb = nbformat.read(path, as_version=4)
    rel = _rel(path)
    out = []
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            text = markdown_source(cell)
            if text.strip():
                out.append(Source(f"{path.stem} cell {cell.id}", text, rel))
    key = path.stem[:2]
    for folder in ("quizzes", "predictions", "hints"):
        file = ROOT / "mha_course" / "kit" / folder / f"{key}.json"
        if file.exists():
            data = json.loads(file.read_text(encoding="utf-8"))
            for context, _, text in i18n.data_fields(folder, data):
                out.append(Source(context, text, file.relative_to(ROOT).as_posix()))
    return out


def _tr_calls(path: Path) -> Iterable[tuple[str, str]]:
    """(text, context) of every ``tr("…", "…")`` / ``translate("…", "…")`` call with literal
    arguments in a package module."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and len(node.args) >= 2:
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            text, context = node.args[0], node.args[1]
            if (
                name in ("tr", "translate")
                and isinstance(text, ast.Constant)
                and isinstance(text.value, str)
                and isinstance(context, ast.Constant)
                and isinstance(context.value, str)
            ):
                yield text.value, context.value


def message_sources() -> list[Source]:
    """The package's own messages: every literal ``tr(...)`` call, the checkers' verdict templates
    and diagnoses, the course map, the notation and the glossary's meanings."""
    from mha_course.check import framework
    from mha_course.kit import course_map

    out = []
    for path in sorted((ROOT / "mha_course").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        for text, context in _tr_calls(path):
            out.append(Source(context, text, rel))
    from mha_course.kit import hint_ladder

    for name in (*hint_ladder.RUNG_NAMES, "one more step"):
        out.append(Source("hint rung name", name, "mha_course/kit/hint_ladder.py"))
    for label in ("output", "your result", "mask"):
        out.append(Source("label", label, "mha_course/check/framework.py", "what a checker compares"))
    for status in framework.STATUSES:
        out.append(Source("status", status, "mha_course/check/framework.py", "a checker's status word"))
    for template in dict.fromkeys(framework.VERDICTS + framework.DETAILS):
        out.append(
            Source(
                "verdict",
                template,
                "mha_course/check/framework.py",
                "keep every {name} field; the fields may move",
            )
        )
    table = json.loads((ROOT / "mha_course/check/diagnoses.json").read_text(encoding="utf-8"))
    for checker, words in table.items():
        for name, text in words.items():
            out.append(Source(f"diagnosis {checker} {name}", text, "mha_course/check/diagnoses.json"))
    for stem, title, line in course_map.NOTEBOOKS:
        out.append(Source(f"course map {stem} title", title, "mha_course/kit/course_map.py"))
        out.append(Source(f"course map {stem} line", line, "mha_course/kit/course_map.py"))
    for symbol, meaning in course_map.NOTATION:
        out.append(Source(f"notation {symbol}", meaning, "mha_course/kit/course_map.py"))
    for term, _, meaning in course_map.GLOSSARY:
        out.append(Source(f"glossary {term}", meaning, "mha_course/kit/course_map.py"))
    return _unique(out) + [s for s in figure_sources() if ("figure", s.text) not in {(o.context, o.text) for o in out}]


#: calls whose text argument is a figure's words (titles, axis labels, legends, annotations)
_FIGURE_CALLS = {
    "set_title",
    "set_xlabel",
    "set_ylabel",
    "suptitle",
    "title",
    "xlabel",
    "ylabel",
    "set_label",
    "text",
    "annotate",
    "heatmap",
    "figtext",
}
_FIGURE_KEYWORDS = {"label", "title", "xlabel", "ylabel", "suptitle"}


def _figure_template(node) -> str | None:
    """The English of a figure text argument: a literal, or an f-string as a template whose
    replacement fields are numbered ({0}, {1} …: mha_course.i18n fills them from the drawn text)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        text = node.value
    elif isinstance(node, ast.JoinedStr):
        parts, k = [], 0
        for value in node.values:
            if isinstance(value, ast.Constant):
                parts.append(str(value.value).replace("{", "{{").replace("}", "}}"))
            else:
                parts.append(f"{{{k}}}")
                k += 1
        text = "".join(parts)
    else:
        return None
    words = re.sub(r"\{\d+\}", " ", text)
    return (
        text
        if re.search(r"[a-z]{3,}", words)
        and not re.fullmatch(r"[\w.]+", text.strip())
        or " " in text.strip()
        and re.search(r"[a-z]{3,}", words)
        else None
    )


def figure_texts(source: str) -> list[str]:
    """The figure words (see _FIGURE_CALLS) written as literals or f-strings in Python ``source``."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):  # a plotting helper's default words
            args = node.args
            named = list(zip(args.kwonlyargs, args.kw_defaults, strict=True))
            named += list(zip(args.args[::-1], args.defaults[::-1], strict=False))
            out += [t for a, d in named if a.arg in _FIGURE_KEYWORDS and d is not None and (t := _figure_template(d))]
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            candidates = []
            if name in _FIGURE_CALLS:
                candidates += node.args[2:3] if name in ("text", "figtext") else node.args[:1]
            candidates += [k.value for k in node.keywords if k.arg in _FIGURE_KEYWORDS]
            for c in candidates:
                text = _figure_template(c)
                if text is not None:
                    out.append(text)
    return out


#: a code cell that draws (its tuples and lists of words label figures: titles and labels set in a loop)
_DRAWS = re.compile(r"\b(plt|ax|axes|fig|heatmap|subplots)\b")
#: the package's modules whose tuples and lists of words are figure labels (tick and legend labels)
FIGURE_MODULES = (
    "address_book.py",
    "hand_set_heads.py",
    "head_budget.py",
    "decoding.py",
    "attention_across_devices.py",
    "efficient_attention.py",
)


def listed_texts(source: str) -> list[str]:
    """The words in the tuples and lists of Python ``source`` (not those printed or raised): the
    titles and labels a loop sets, the tick labels a figure is given."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") in ("print", "ValueError", "TypeError"):
            skip |= {id(n) for n in ast.walk(node)}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Tuple, ast.List)) and id(node) not in skip:
            for element in node.elts:
                text = _figure_template(element)
                if text is not None and not text.startswith("tab:"):
                    out.append(text)
    return out


def figure_sources() -> list[Source]:
    """The words of every figure the notebooks draw, from their code cells and the package's modules
    (context "figure"): drawn in Chinese in the Chinese edition (mha_course.kit.plotting.use_cjk_font)."""
    import nbformat

    out = []
    for path in notebook_tools.numbered_notebooks():
        rel = path.relative_to(ROOT).as_posix()
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type == "code":
                code = "\n".join(
                    line for line in notebook_tools._source(cell).splitlines() if not line.startswith(("%", "!"))
                )
                out += [Source("figure", text, rel) for text in figure_texts(code)]
                if _DRAWS.search(code):
                    out += [Source("figure", text, rel) for text in listed_texts(code)]
    for path in sorted((ROOT / "mha_course").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        code = path.read_text(encoding="utf-8")
        out += [Source("figure", text, rel) for text in figure_texts(code)]
        if path.name in FIGURE_MODULES:
            out += [Source("figure", text, rel) for text in listed_texts(code)]
    return _unique(out)


def _unique(sources: list[Source]) -> list[Source]:
    seen, out = set(), []
    for s in sources:
        if (s.context, s.text) not in seen:
            seen.add((s.context, s.text))
            out.append(s)
    return out


def catalogues() -> dict[str, list[Source]]:
    """catalogue name ("00" … "17", "messages") -> its English sources, in order."""
    out = {p.stem[:2]: _unique(notebook_sources(p)) for p in notebook_tools.numbered_notebooks()}
    out["messages"] = message_sources()
    return out


def _rel(path: Path) -> str:
    """``path`` relative to the repository (its name when it lies elsewhere: a scratch copy)."""
    try:
        return Path(path).resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return Path(path).name


def po_path(name: str, locale: Path | None = None) -> Path:
    return (LOCALE if locale is None else Path(locale)) / f"{name}.po"


# ---------------------------------------------------------------------------------------------
# update and check


def update(name: str, sources: list[Source], *, locale: Path | None = None) -> dict[str, int]:
    """Merge ``sources`` into catalogue ``name`` as msgmerge does: an entry whose English is
    unchanged keeps its translation; one whose English changed (same context) keeps its
    translation as a fuzzy suggestion with the old English as previous msgid; new texts get an
    empty entry; entries whose context is gone are dropped. Returns counts of each."""
    import polib

    path = po_path(name, locale)
    old = polib.pofile(str(path), wrapwidth=0) if path.exists() else None
    exact = {(e.msgctxt, e.msgid): e for e in old} if old is not None else {}
    # a changed English is found by its context, where the context names one text only (a cell,
    # a quiz option); a context shared by several messages ("quiz") cannot say which one changed
    shared = {c for c in [s.context for s in sources] if [s.context for s in sources].count(c) > 1}
    if old is not None:
        old_contexts = [e.msgctxt for e in old]
        shared |= {c for c in old_contexts if old_contexts.count(c) > 1}
    by_context = {e.msgctxt: e for e in old if e.msgctxt not in shared} if old is not None else {}
    new = polib.POFile(wrapwidth=0)
    new.metadata = dict(METADATA)
    counts = {"kept": 0, "fuzzy": 0, "new": 0, "dropped": 0}
    for s in sources:
        entry = polib.POEntry(msgctxt=s.context, msgid=s.text, msgstr="", occurrences=[(s.where, "")])
        if s.note:
            entry.comment = s.note
        previous = exact.get((s.context, s.text)) or by_context.get(s.context)
        if previous is not None and previous.msgid == s.text:
            entry.msgstr, entry.flags = previous.msgstr, list(previous.flags)
            entry.previous_msgid = previous.previous_msgid
            counts["kept"] += 1
        elif previous is not None and previous.msgstr:
            entry.msgstr, entry.flags, entry.previous_msgid = previous.msgstr, ["fuzzy"], previous.msgid
            counts["fuzzy"] += 1
        else:
            counts["new"] += 1
        entry.tcomment = previous.tcomment if previous is not None else ""
        new.append(entry)
    if old is not None:
        counts["dropped"] = len({e.msgctxt for e in old} - {s.context for s in sources})
    path.parent.mkdir(parents=True, exist_ok=True)
    text = str(new).rstrip("\n") + "\n"
    if not path.exists() or path.read_text(encoding="utf-8") != text:
        path.write_text(text, encoding="utf-8")
    return counts


def _label(s: Source) -> str:
    first = next((line.strip() for line in s.text.splitlines() if line.strip()), "")
    return f"{s.context} ({first[:60]}{'…' if len(first) > 60 else ''})"


def mo_path(name: str, locale: Path | None = None) -> Path:
    """The compiled catalogue the package reads (gettext's layout: LANG/LC_MESSAGES/NAME.mo)."""
    return (LOCALE if locale is None else Path(locale)) / "LC_MESSAGES" / f"{name}.mo"


def compiled(name: str, locale: Path | None = None) -> bytes:
    """Catalogue ``name`` compiled as msgfmt does (its translated, non-fuzzy entries)."""
    import tempfile

    import polib

    with tempfile.TemporaryDirectory() as tmp:
        polib.pofile(str(po_path(name, locale))).save_as_mofile(str(Path(tmp) / "out.mo"))
        return (Path(tmp) / "out.mo").read_bytes()


def compile_catalogue(name: str, locale: Path | None = None) -> bool:
    """Write the compiled catalogue ``name``; True when it changed."""
    data, target = compiled(name, locale), mo_path(name, locale)
    if target.exists() and target.read_bytes() == data:
        return False
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
    return True


def problems(name: str, sources: list[Source], *, locale: Path | None = None) -> list[str]:
    """What stops catalogue ``name`` from translating ``sources``: each text missing from the
    catalogue, untranslated, or fuzzy (its English changed since the translation), named."""
    import polib

    path = po_path(name, locale)
    if not path.exists():
        return [f"{_rel(path)}: no catalogue (run python -m authoring translate --update)"]
    entries = {(e.msgctxt, e.msgid): e for e in polib.pofile(str(path)) if not e.obsolete}
    by_context = {c for (c, _) in entries}
    out = []
    for s in sources:
        entry = entries.get((s.context, s.text))
        if entry is None:
            why = "its English changed" if s.context in by_context else "new English, not in the catalogue"
            out.append(f"{name}: {_label(s)}: {why} (run --update, then translate it)")
        elif entry.fuzzy:
            out.append(f"{name}: {_label(s)}: fuzzy — the English changed since the translation")
        elif not entry.msgstr.strip():
            out.append(f"{name}: {_label(s)}: not translated")
    mo = mo_path(name, locale)
    if not mo.exists() or mo.read_bytes() != compiled(name, locale):
        out.append(f"{_rel(mo)}: not compiled from {path.name} as it stands (run --update)")
    return out


def stats() -> list[tuple[str, int, int, int]]:
    """(catalogue, entries, English words, translated entries) of every catalogue."""
    import polib

    rows = []
    for name, sources in catalogues().items():
        path = po_path(name)
        done = 0
        if path.exists():
            done = sum(1 for e in polib.pofile(str(path)) if e.msgstr and not e.fuzzy and not e.obsolete)
        rows.append((name, len(sources), sum(len(s.text.split()) for s in sources), done))
    return rows


# ---------------------------------------------------------------------------------------------
# what a translation must keep: numbers, formulas, code, links, structure, terms, typography

_FENCE = re.compile(r"```.*?```", re.S)
_DISPLAY = re.compile(r"\$\$.+?\$\$", re.S)
_INLINE_MATH = re.compile(r"(?<![\\$])\$(?!\$)[^$\n]+?(?<!\\)\$")
_CODE = re.compile(r"(`+)(?!`).+?(?<!`)\1(?!`)", re.S)
_LINK_TARGET = re.compile(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_HTML = re.compile(r"<[a-zA-Z/][^>]*>")
_FIELD = re.compile(r"\{\w+\}")  # a message's replacement field
_INDENTED = re.compile(r"(?:^|\n\n)((?: {4}.*(?:\n|$))+)")  # an indented code block
_NUMBER = re.compile(r"(?<![\w.])[-−]?\d+(?:[.,]\d+)*(?:e[-−+]?\d+)?")
_HEADING = re.compile(r"^(#{1,6})\s+(\S*)", re.M)


def protected(text: str) -> dict[str, list[str]]:
    """The parts of ``text`` a translation keeps byte for byte: code blocks, formulas, inline code,
    link targets and HTML tags (each as a sorted list), and the numbers of the prose around them."""
    out: dict[str, list[str]] = {}
    rest = text
    for kind, pattern in (
        ("code block", _FENCE),
        ("formula", _DISPLAY),
        ("formula ", _INLINE_MATH),
        ("inline code", _CODE),
    ):
        found = pattern.findall(rest) if pattern is not _CODE else [m.group(0) for m in pattern.finditer(rest)]
        out[kind.strip()] = out.get(kind.strip(), []) + found
        rest = pattern.sub(" ", rest)
    out["link target"] = _LINK_TARGET.findall(rest)
    out["HTML tag"] = _HTML.findall(rest)
    rest = _LINK_TARGET.sub("]", _HTML.sub(" ", rest))
    out["number"] = [n.replace("−", "-") for n in _NUMBER.findall(rest)]
    return {k: sorted(v) for k, v in out.items()}


def rendered(text: str) -> list[str]:
    """What CommonMark (markdown-it, as Jupyter renders) makes of ``text``: the counts of headings by
    level, list items, table rows, blockquotes, code blocks, links, bold and italic spans. A ``**``
    closed right after full-width punctuation and before a Chinese character is not bold in
    CommonMark: its count shows it."""
    import collections

    from markdown_it import MarkdownIt

    counts: collections.Counter = collections.Counter()
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)  # an authors' comment opens an HTML block
    for token in MarkdownIt("commonmark").enable("table").parse(text):
        if token.type in ("heading_open",):
            counts[f"heading {token.tag}"] += 1
        elif token.type in ("list_item_open", "tr_open", "blockquote_open", "code_block", "fence"):
            counts[token.type.replace("_open", "")] += 1
        for child in token.children or ():
            if child.type in ("strong_open", "em_open", "link_open", "code_inline", "image"):
                counts[child.type.replace("_open", "")] += 1
    return [f"{v} {k}" for k, v in sorted(counts.items())]


def structure(text: str) -> list[str]:
    """A Markdown text's skeleton: heading levels with their numbers ("## 3."), and what CommonMark
    renders (:func:`rendered`)."""
    body = _FENCE.sub("", text)
    numbers = []
    for m in _HEADING.finditer(body):
        numbers.append(f"{m.group(1)} {m.group(2)}".strip() if re.match(r"^[\d.]+$", m.group(2)) else m.group(1))
    return numbers + rendered(text)


def _diff_lists(a: list[str], b: list[str]) -> tuple[list[str], list[str]]:
    import collections

    ca, cb = collections.Counter(a), collections.Counter(b)
    return sorted((ca - cb).elements()), sorted((cb - ca).elements())


#: glossary words with a second meaning the glossary's Chinese does not fit ("rank" of a matrix, to rank)
AMBIGUOUS = {"rank"}
#: glossary terms whose English may stay in the Chinese (names and symbols used as they are)
KEEP_ENGLISH = {
    "softmax",
    "logits",
    "FLOPs",
    "all-reduce",
    "all-gather",
    "all-to-all",
    "rank",
    "QK-norm",
    "delta rule",
    "tile",
}
#: other accepted renderings of a glossary term (a term's Chinese used with a measure word, say)
ALSO = {
    "parameters": ("参数",),
    "online softmax": ("在线 softmax", "在线softmax"),
    "attention sink": ("汇聚点", "sink"),
    "token": ("词元", "token"),
    "gate": ("门",),
    "exercise": ("练习", "习题"),
    "tile": ("分块", "块"),
    "gradient": ("梯度",),
    "mask": ("掩码",),
    "may attend": ("可以关注", "可关注", "能关注", "允许关注"),
    "embedding": ("嵌入", "embedding"),
}


def glossary_terms() -> list[tuple[re.Pattern, str, tuple[str, ...]]]:
    """(English pattern, English, accepted Chinese renderings) of every glossary term, longest first."""
    from mha_course.kit import course_map

    terms = []
    for english, chinese, _ in course_map.GLOSSARY:
        for en, zh in (
            zip(english.split(" / "), chinese.split(" / "), strict=False) if " / " in english else [(english, chinese)]
        ):
            base = re.sub(r"\s*\(.*?\)", "", en).strip()
            forms = {zh.strip()}
            m = re.match(r"^(.*?)（(.*?)）$", zh.strip())
            if m:
                forms |= {m.group(1).strip(), m.group(2).strip()}
            forms |= set(ALSO.get(base, ()))
            if base in KEEP_ENGLISH:
                forms.add(base)
            pattern = re.compile(
                r"(?<![\w-])" + re.escape(base).replace(r"\ ", r"[\s-]+") + r"(?:s|es)?(?![\w-])", re.I
            )
            terms.append((pattern, base, tuple(sorted(forms))))
    return sorted(terms, key=lambda t: -len(t[1]))


def _prose(text: str, *, fields: bool = False) -> str:
    """``text`` without its code, formulas and link targets (and with ``fields``, its {fields})."""
    for pattern in (_FENCE, _DISPLAY, _INLINE_MATH, _CODE, _LINK_TARGET, _INDENTED, *([_FIELD] if fields else [])):
        text = pattern.sub(" ", text)
    return text


def missing_terms(english: str, chinese: str, ignore: Iterable[str] = ()) -> list[str]:
    """Glossary terms of ``english``'s prose (code and formulas left out) whose Chinese is not in
    ``chinese``; ``ignore``: terms a translator marked as used in another sense (a paper's title)."""
    ignore = set(ignore)
    prose = _prose(english, fields=True)
    out = []
    for pattern, base, forms in glossary_terms():
        if base in AMBIGUOUS or base in ignore:
            prose = pattern.sub(" ", prose)
            continue
        if pattern.search(prose):
            prose = pattern.sub(" ", prose)
            if not any(f in chinese for f in forms):
                out.append(f"{base} → {' / '.join(forms)}")
    return out


def typography(chinese: str) -> list[str]:
    """What autocorrect (Chinese copywriting rules: spaces between CJK and Latin, full-width
    punctuation) would change in ``chinese``, one "old → new" per line."""
    import autocorrect_py

    result = autocorrect_py.lint_for(chinese if chinese.endswith("\n") else chinese + "\n", "md")
    return [f"line {r.line}: {r.old.strip()!r} → {r.new.strip()!r}" for r in result.lines]


def entry_problems(english: str, chinese: str, *, terms: bool = True, ignore: Iterable[str] = ()) -> list[str]:
    """Everything a translation ``chinese`` of ``english`` changed that it must keep."""
    out = []
    a, b = protected(english), protected(chinese)
    for kind in a:
        lost, added = _diff_lists(a[kind], b[kind])
        if lost or added:
            out.append(
                f"{kind}: "
                + "; ".join(([f"missing {lost}"] if lost else []) + ([f"not in the English {added}"] if added else []))
            )
    sa, sb = structure(english), structure(chinese)
    if sa != sb:
        out.append(f"Markdown structure differs: English {sa}, Chinese {sb}")
    fields = [set(re.findall(r"\{\w+\}", _prose(t))) for t in (english, chinese)]
    for placeholder in sorted(fields[0] ^ fields[1]):
        out.append(f"placeholder {placeholder} differs")
    if terms:
        out += [f"glossary term not rendered as in the glossary: {t}" for t in missing_terms(english, chinese, ignore)]
    out += [f"typography: {t}" for t in typography(chinese)]
    return out


#: a translator's comment (``# glossary: not rank, self-attention``) naming glossary terms that
#: an entry uses in another sense or inside a title kept in English
_IGNORE = re.compile(r"glossary: not ([^\n]+)")


def lint(name: str) -> list[str]:
    """The problems of every translated entry of catalogue ``name`` (see :func:`entry_problems`)."""
    import polib

    out = []
    for e in polib.pofile(str(po_path(name))):
        if e.msgstr and not e.obsolete:
            terms = not e.msgctxt.startswith(("status", "glossary"))
            ignore = [
                t.strip() for m in _IGNORE.findall(e.tcomment or "") for t in re.split(r" \(| —", m)[0].split(",")
            ]
            for problem in entry_problems(e.msgid, e.msgstr, terms=terms, ignore=ignore):
                out.append(f"{name}: {e.msgctxt}: {problem}")
    return out


# ---------------------------------------------------------------------------------------------
# the Chinese notebooks


def zh_setup_source() -> str:
    """The Chinese notebooks' setup cell: the English one, speaking Chinese."""
    return notebook_tools.setup_source(LANG)


def translation_table(name: str) -> dict[tuple[str, str], str]:
    import polib

    return {
        (e.msgctxt, e.msgid): e.msgstr
        for e in polib.pofile(str(po_path(name)))
        if e.msgstr and not e.fuzzy and not e.obsolete
    }


def zh_notebook(path: Path):
    """The Chinese twin of English notebook ``path``: each Markdown cell replaced by its
    translation (relative links rewritten for notebooks/zh/, the badge pointing at the twin), the
    setup cell speaking Chinese, every other code cell the same. A missing translation is an error."""
    import nbformat

    from .student_edition import _rewrite_links

    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    table = translation_table(path.stem[:2])
    twin = copy.deepcopy(nb)
    for cell in twin.cells:
        if cell.cell_type == "markdown":
            english = markdown_source(cell)
            if not english.strip():
                continue
            zh = table.get((f"{path.stem} cell {cell.id}", english))
            if zh is None:
                raise ValueError(f"{path.stem} cell {cell.id}: no current translation (run translate --check)")
            cell.source = _rewrite_links(zh, path.parent, ZH_REL)
        elif notebook_tools.SETUP_TAG in cell.get("metadata", {}).get("tags", []):
            cell.source = zh_setup_source()
    first_md = next(c for c in twin.cells if c.cell_type == "markdown")
    src = notebook_tools._source(first_md)
    lines = src.split("\n", 1)
    badge = notebook_tools.badge_for(f"{ZH_REL}/{path.name}")
    first_md.source = lines[0] + "\n\n" + badge + ("\n\n" + lines[1].lstrip("\n") if len(lines) > 1 else "")
    twin.metadata.setdefault("language_info", {})
    twin.metadata["mha_course"] = {"language": LANG, "source": f"notebooks/{path.name}"}
    return twin


def build(keys: Iterable[str] | None = None) -> list[Path]:
    """Write the Chinese twin of each English notebook (default: every one whose catalogue is
    complete) into notebooks/zh/, keeping the outputs a twin already has for code cells whose
    source is unchanged (execute the twins afterwards). Returns the paths written."""
    import nbformat

    ZH_DIR.mkdir(parents=True, exist_ok=True)
    written = []
    wanted = set(keys) if keys else None
    for path in notebook_tools.numbered_notebooks():
        key = path.stem[:2]
        if wanted is not None and key not in wanted:
            continue
        if wanted is None and problems(key, _unique(notebook_sources(path))):
            continue
        twin = zh_notebook(path)
        target = ZH_DIR / path.name
        if target.exists():
            old = nbformat.read(target, as_version=4)
            outputs = {(c.id, notebook_tools._source(c)): c for c in old.cells if c.cell_type == "code"}
            for cell in twin.cells:
                if cell.cell_type == "code":
                    before = outputs.get((cell.id, notebook_tools._source(cell)))
                    cell.outputs = before.outputs if before is not None else []
                    cell.execution_count = before.execution_count if before is not None else None
        else:
            for cell in twin.cells:
                if cell.cell_type == "code":
                    cell.outputs, cell.execution_count = [], None
        nbformat.validate(twin)
        text = nbformat.writes(twin)
        text = text if text.endswith("\n") else text + "\n"
        if not target.exists() or target.read_text(encoding="utf-8") != text:
            target.write_text(text, encoding="utf-8")
        written.append(target)
    return written


FIGURE_FONT = ROOT / "mha_course" / "kit" / "fonts" / "cjk-subset.otf"


def figure_characters() -> set[str]:
    """The CJK characters of every translated figure text (what the shipped figure font must cover)."""
    from . import site

    table = translation_table("messages")
    return set().union(set(), *(site.cjk_characters(v) for (c, _), v in table.items() if c == "figure"))


def make_figure_font(source: Path) -> tuple[int, int]:
    """Subset CJK font ``source`` (e.g. Debian's NotoSansCJK-Regular.ttc) to figure_characters(),
    as OpenType for matplotlib, into FIGURE_FONT (its licence beside it). Returns (characters, bytes)."""
    import shutil

    from . import site

    characters, size = site.make_cjk_font(Path(source), FIGURE_FONT, characters=figure_characters(), flavor=None)
    shutil.copyfile(site.CJK_FONT.parent / "LICENSE.txt", FIGURE_FONT.parent / "LICENSE.txt")
    return len(characters), size


def zh_notebooks() -> list[Path]:
    """The Chinese notebooks committed (notebooks/zh/NN_*.ipynb)."""
    return sorted(ZH_DIR.glob("[0-9][0-9]_*.ipynb"))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m authoring translate", description=__doc__.split("\n\n")[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--update", action="store_true", help="merge the English into the catalogues")
    group.add_argument("--check", action="store_true", help="exit 1 naming every missing or fuzzy translation")
    group.add_argument("--build", nargs="*", metavar="NN", help="write notebooks/zh/ (default: every complete one)")
    group.add_argument("--stats", action="store_true", help="entries and words of each catalogue")
    group.add_argument("--lint", nargs="*", metavar="NAME", help="what translations changed that they must keep")
    group.add_argument("--font", metavar="PATH", help="remake the figures' CJK font subset from a CJK font")
    parser.add_argument("--only", nargs="*", metavar="NAME", help="catalogues to check or update (00 … 17, messages)")
    args = parser.parse_args(argv)
    cats = catalogues()
    if args.only:
        unknown = sorted(set(args.only) - set(cats))
        if unknown:
            print(f"translate: no catalogue {unknown}; the catalogues are {sorted(cats)}")
            return 2
        cats = {k: v for k, v in cats.items() if k in args.only}
    if args.update:
        for name, sources in cats.items():
            counts = update(name, sources)
            compile_catalogue(name)
            print(f"{po_path(name).relative_to(ROOT)}: " + ", ".join(f"{v} {k}" for k, v in counts.items()))
        return 0
    if args.check:
        found = [p for name, sources in cats.items() for p in problems(name, sources)]
        for line in found:
            print(line)
        total = sum(len(v) for v in cats.values())
        print(
            f"translate --check: {len(found)} of {total} texts need a translator"
            if found
            else f"translate --check: all {total} texts of {len(cats)} catalogues translated and current"
        )
        return 1 if found else 0
    if args.font:
        n, size = make_figure_font(Path(args.font))
        print(f"{FIGURE_FONT.relative_to(ROOT)}: {n} characters, {size:,} bytes")
        return 0
    if args.lint is not None:
        names = args.lint or list(cats)
        found = [p for name in names for p in lint(name)]
        for line in found:
            print(line)
        print(f"translate --lint: {len(found)} problems in {', '.join(names)}")
        return 1 if found else 0
    if args.stats:
        rows = [r for r in stats() if r[0] in cats]
        for name, n, words, done in rows:
            print(f"{name:>8}: {n:4d} entries, {words:6,d} English words, {done:4d} translated")
        print(
            f"{'total':>8}: {sum(r[1] for r in rows):4d} entries, {sum(r[2] for r in rows):6,d} English words, "
            f"{sum(r[3] for r in rows):4d} translated"
        )
        return 0
    for path in build(args.build or None):
        print(
            f"{path.relative_to(ROOT)}: written (now execute it: python -m authoring execute {path.relative_to(ROOT)})"
        )
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
