"""The course's languages: English, the source, and Simplified Chinese, from gettext catalogues.

    mc.set_language("zh")      checkers, quizzes, predictions, hints and the course map in Chinese
    mc.set_language("en")      back to English (the default; or MHA_COURSE_LANG=zh before the import)

The Chinese notebooks call ``mc.setup(language="zh")`` in their setup cell. The translations live
in standard gettext catalogues, shipped with the package (their compiled ``.mo`` files, written by
``python -m authoring translate --update`` into ``LC_MESSAGES/``, are read with Python's gettext)::

    mha_course/locale/zh/NN.po         one per notebook: its Markdown cells, quiz, predictions, hints
    mha_course/locale/zh/messages.po   the package's own messages: checkers' verdicts and diagnoses,
                                       the course map, the glossary's meanings, progress and widgets

Each entry's msgid is the English text and its msgctxt names where the text belongs (a notebook
cell's id, a quiz option, a checker's mistake). A text whose entry is missing, untranslated or
fuzzy (its English changed since it was translated) stays English: ``python -m authoring
translate --check`` lists those, and the test suite runs it.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from importlib import resources

#: the languages the course speaks: code -> name
LANGUAGES = {"en": "English", "zh": "简体中文"}
#: environment variable read at import (and by a fresh kernel): the language to start in
LANGUAGE_VARIABLE = "MHA_COURSE_LANG"
#: the catalogue of the package's own messages (the others are named after their notebook: "05")
MESSAGES = "messages"

_state = {"language": "en"}


def _normalise(language: str) -> str:
    if not isinstance(language, str):
        raise TypeError(f"language should be a string such as 'zh' or 'en', got {type(language).__name__}")
    code = language.strip().lower().replace("_", "-")
    code = {"zh-cn": "zh", "zh-hans": "zh", "zh-sg": "zh", "cn": "zh", "chinese": "zh", "english": "en"}.get(code, code)
    code = code.split("-")[0] if code.startswith("en-") else code
    if code not in LANGUAGES:
        raise ValueError(f"language should be one of {sorted(LANGUAGES)} (e.g. 'zh' or 'en'), got {language!r}")
    return code


def set_language(language: str) -> str:
    """Speak ``language`` ("en" or "zh"; "zh-CN", "zh_Hans" … mean "zh") from now on: checkers'
    verdicts, quizzes, predictions, hint ladders, the course map. Returns the code set."""
    _state["language"] = _normalise(language)
    return _state["language"]


def language() -> str:
    """The code of the language the course speaks now ("en" or "zh")."""
    return _state["language"]


@functools.cache
def _catalogue(lang: str, name: str) -> dict[tuple[str, str], str]:
    """(msgctxt, msgid) -> msgstr of the compiled catalogue ``name`` (its translated, current
    entries: a fuzzy or empty one is left out when it is compiled)."""
    import gettext

    path = resources.files("mha_course").joinpath("locale").joinpath(lang).joinpath("LC_MESSAGES")
    try:
        with path.joinpath(f"{name}.mo").open("rb") as fp:
            compiled = gettext.GNUTranslations(fp)
    except (FileNotFoundError, OSError):
        return {}
    table = {}
    for key, msgstr in compiled._catalog.items():  # "context\x04msgid" for an entry with a context
        if isinstance(key, str) and key:
            context, _, msgid = key.rpartition("\x04")
            table[(context, msgid)] = msgstr
    return table


def translate(text: str, context: str, *, catalogue: str = MESSAGES, lang: str | None = None) -> str:
    """``text`` in the current language (or ``lang``): its catalogue's translation for
    ``context``, else ``text`` itself."""
    lang = language() if lang is None else lang
    if lang == "en" or not text:
        return text
    return _catalogue(lang, catalogue).get((context, text), text)


def tr(text: str, context: str, **values) -> str:
    """A package message in the current language, then ``str.format(**values)``: the catalogue
    holds the template (``"{name}: correct on {n} cases"``), so a translation may reorder the values."""
    template = translate(text, context)
    return template.format(**values) if values else template


@functools.cache
def _by_text(lang: str, prefix: str) -> dict[str, str]:
    """msgid -> msgstr of the package entries whose context starts with ``prefix`` (the first wins)."""
    table: dict[str, str] = {}
    for (context, msgid), msgstr in _catalogue(lang, MESSAGES).items():
        if context.startswith(prefix):
            table.setdefault(msgid, msgstr)
    return table


@functools.cache
def _template_pattern(template: str):
    import re

    parts = re.split(r"(\{\w+\})", template)
    fields = [p[1:-1] for p in parts if p.startswith("{") and p.endswith("}")]
    # the first and the last field as short as they can be (a name; the last parentheses), the
    # ones between as long (a problem that has parentheses of its own)
    regex = "".join(
        (f"(?P<{p[1:-1]}>.+?)" if p[1:-1] in (fields[0], fields[-1]) else f"(?P<{p[1:-1]}>.+)")
        if p.startswith("{") and p.endswith("}")
        else re.escape(p)
        for p in parts
    )
    return re.compile(regex, re.S)


def verdict(message: str, templates: tuple[str, ...], *, lang: str | None = None) -> str:
    """A checker's English verdict line ``message`` in the current language: the first of
    ``templates`` (English, with {fields}) it matches is translated whole, its fields filled from the
    English line — a diagnosis and a case's place translated in turn, the rest (names, values,
    Python's own error text) kept."""
    lang = language() if lang is None else lang
    if lang == "en":
        return message
    for template in templates:
        m = _template_pattern(template).fullmatch(message)
        if m is None:
            continue
        target = translate(template, "verdict", lang=lang)
        if target == template:
            return message
        values = m.groupdict()
        for field, value in values.items():
            if field == "diagnosis":
                values[field] = _by_text(lang, "diagnosis ").get(value, value)
            elif field in ("where", "problem"):
                from .check.framework import DETAILS

                values[field] = verdict(value, DETAILS, lang=lang) if value != message else value
            elif field == "label":
                values[field] = translate(value, "label", lang=lang)
        return target.format(**values)
    return _by_text(lang, "").get(message, message)


@functools.cache
def _figure_templates(lang: str) -> tuple:
    """(pattern, translation) of each translated figure text with numbered fields ({0}, {1} …)."""
    import re

    out = []
    for (context, msgid), msgstr in _catalogue(lang, MESSAGES).items():
        if context == "figure" and re.search(r"\{\d+\}", msgid):
            parts = re.split(r"(\{\d+\})", msgid)
            regex = "".join(
                f"(?P<f{p[1:-1]}>.*?)"
                if re.fullmatch(r"\{\d+\}", p)
                else re.escape(p.replace("{{", "{").replace("}}", "}"))
                for p in parts
            )
            out.append((re.compile(regex, re.S), msgstr))
    return tuple(out)


def figure_text(text: str, *, lang: str | None = None) -> str:
    """A figure's English words (a title, an axis label, a legend entry) in the current language:
    the catalogue's translation of the literal, or of the f-string it was made from."""
    lang = language() if lang is None else lang
    if lang == "en" or not text or not any(c.isalpha() for c in text):
        return text
    table = _catalogue(lang, MESSAGES)
    found = table.get(("figure", text))
    if found is not None:
        return found
    for pattern, msgstr in _figure_templates(lang):
        m = pattern.fullmatch(text)
        if m:
            values = [m.group(f"f{k}") for k in range(len(m.groupdict()))]
            return msgstr.format(*values)
    return text


# ---------------------------------------------------------------------------------------------
# the course data (quizzes, predictions, hint ladders): which fields a learner reads


def data_fields(folder: str, data: dict) -> Iterator[tuple[str, tuple, str]]:
    """(context, path, text) of every field of a course data file that a learner reads — the
    quiz's questions, options and explanations, the predictions' questions and options, the hint
    rungs — with ``path`` the keys that lead to it. The tooling fields (which option is correct, a
    distractor's misconception, what settles a prediction) are not translated."""
    if folder == "quizzes":
        key = str(data.get("notebook", ""))[:2]
        for i, q in enumerate(data.get("questions", []), 1):
            for field in ("question", "section"):
                if q.get(field):
                    yield f"quiz {key} q{i} {field}", ("questions", i - 1, field), q[field]
            for j, option in enumerate(q.get("options", []), 1):
                for field in ("text", "explanation"):
                    if option.get(field):
                        yield (
                            f"quiz {key} q{i} option {j} {field}",
                            ("questions", i - 1, "options", j - 1, field),
                            option[field],
                        )
    elif folder == "predictions":
        for name, p in data.items():
            if isinstance(p, dict):
                if p.get("question"):
                    yield f"prediction {name} question", (name, "question"), p["question"]
                for j, option in enumerate(p.get("options", []), 1):
                    yield f"prediction {name} option {j}", (name, "options", j - 1), option
    elif folder == "hints":
        for exercise, h in data.items():
            if isinstance(h, dict):
                for k, rung in enumerate(h.get("ladder", []), 1):
                    yield f"hint {exercise} rung {k}", (exercise, "ladder", k - 1), rung


def translate_data(folder: str, notebook: str, data: dict, *, lang: str | None = None) -> dict:
    """A copy of course data ``data`` (of notebook "05" …) with every field of :func:`data_fields`
    in the current language (or ``lang``); ``data`` itself in English."""
    lang = language() if lang is None else lang
    if lang == "en":
        return data
    import copy

    out = copy.deepcopy(data)
    for context, path, text in list(data_fields(folder, data)):
        target = out
        for step in path[:-1]:
            target = target[step]
        target[path[-1]] = translate(text, context, catalogue=notebook.split("_")[0], lang=lang)
    return out


def _start_language() -> None:
    value = os.environ.get(LANGUAGE_VARIABLE, "").strip()
    if value:
        try:
            set_language(value)
        except ValueError:  # a wrong variable must not break the import; say so once
            import warnings

            warnings.warn(
                f"{LANGUAGE_VARIABLE}={value!r} is not one of {sorted(LANGUAGES)}: using English", stacklevel=2
            )


_start_language()
