"""The Chinese edition: its gettext catalogues complete, current and faithful to the English (numbers,
formulas, code, links, Markdown, glossary terms, Chinese typography), the package speaking Chinese
when told to, and the Chinese notebooks built from the English ones and the catalogues."""

from __future__ import annotations

import json
import re
import shutil
import warnings
from pathlib import Path

import nbformat
import polib
import pytest

import mha_course as mc
from authoring import notebooks as notebook_tools
from authoring import translate
from mha_course import i18n

ROOT = Path(__file__).resolve().parent.parent
CATALOGUES = translate.catalogues()
ENGLISH = notebook_tools.numbered_notebooks()


# ---------------------------------------------------------------------------------------------
# the catalogues


def test_every_text_is_translated_and_current():
    """`python -m authoring translate --check`: an English edit without its Chinese fails here."""
    found = [p for name, sources in CATALOGUES.items() for p in translate.problems(name, sources)]
    assert not found, (
        "texts without a current translation (python -m authoring translate --update, then translate):\n"
        + "\n".join(found[:40])
    )


def test_the_check_command_exits_zero_and_says_so(capsys):
    assert translate.main(["--check"]) == 0
    assert "translated and current" in capsys.readouterr().out


@pytest.mark.parametrize("name", sorted(CATALOGUES))
def test_catalogue_is_standard_gettext(name, tmp_path):
    """One entry per English text, each with its context and its occurrence, valid UTF-8 gettext
    that compiles to a .mo file (what msgfmt makes) and reads back the same."""
    path = translate.po_path(name)
    po = polib.pofile(str(path))
    assert po.metadata["Language"] == "zh_CN" and "UTF-8" in po.metadata["Content-Type"]
    keys = [(e.msgctxt, e.msgid) for e in po]
    assert len(keys) == len(set(keys)), "duplicate (msgctxt, msgid) entries"
    assert all(e.msgctxt and e.occurrences for e in po), "every entry names its context and its file"
    po.save_as_mofile(str(tmp_path / f"{name}.mo"))
    mo = polib.mofile(str(tmp_path / f"{name}.mo"))
    assert {(e.msgctxt, e.msgid): e.msgstr for e in mo} == {(e.msgctxt, e.msgid): e.msgstr for e in po if e.msgstr}


@pytest.mark.parametrize("name", sorted(CATALOGUES))
def test_translations_keep_what_they_must(name):
    """Numbers, formulas, inline code, link targets, the rendered Markdown (headings and their
    numbers, lists, tables, bold and italic), placeholders, glossary terms and Chinese typography
    (autocorrect) — `python -m authoring translate --lint NN`."""
    found = translate.lint(name)
    assert not found, "\n".join(found[:30])


def test_a_changed_english_sentence_fails_the_check_with_that_cells_name(tmp_path):
    """Change one sentence of a scratch copy of notebook 05: the check names the cell; --update
    then keeps the old Chinese as a fuzzy suggestion with the old English as its previous msgid."""
    path = tmp_path / ENGLISH[5].name
    shutil.copy(ENGLISH[5], path)
    nb = nbformat.read(path, as_version=4)
    cell = next(c for c in nb.cells if c.cell_type == "markdown" and "padding" in notebook_tools._source(c))
    old = notebook_tools._source(cell)
    cell.source = old.replace("padding", "PADDING", 1)
    nbformat.write(nb, path)
    sources = translate._unique(translate.notebook_sources(path))
    found = translate.problems("05", sources)
    assert len(found) == 1 and f"cell {cell.id}" in found[0] and "its English changed" in found[0]
    locale = tmp_path / "locale"
    locale.mkdir()
    shutil.copy(translate.po_path("05"), locale / "05.po")
    counts = translate.update("05", sources, locale=locale)
    assert counts["fuzzy"] == 1 and counts["new"] == 0 and counts["kept"] == len(sources) - 1
    entry = next(e for e in polib.pofile(str(locale / "05.po")) if e.msgctxt.endswith(cell.id))
    assert entry.fuzzy and entry.previous_msgid == translate.markdown_source(
        nbformat.from_dict({"cell_type": "markdown", "source": old, "metadata": {}})
    )
    assert entry.msgstr, "the old translation stays, as a suggestion"
    found = [p for p in translate.problems("05", sources, locale=locale) if ".mo:" not in p]  # (no .mo copied)
    assert len(found) == 1 and "fuzzy" in found[0]


def test_a_stale_compiled_catalogue_is_named(tmp_path):
    """The package reads the .mo: a .po edited without --update fails the check."""
    locale = tmp_path / "locale"
    (locale / "LC_MESSAGES").mkdir(parents=True)
    shutil.copy(translate.po_path("03"), locale / "03.po")
    shutil.copy(translate.mo_path("03"), locale / "LC_MESSAGES" / "03.mo")
    sources = CATALOGUES["03"]
    assert translate.problems("03", sources, locale=locale) == []
    po = polib.pofile(str(locale / "03.po"))
    po[0].msgstr += "。"
    po.save()
    assert [p for p in translate.problems("03", sources, locale=locale)] == [
        "03.mo: not compiled from 03.po as it stands (run --update)"
    ]


def test_a_new_cell_is_a_new_empty_entry(tmp_path):
    path = tmp_path / ENGLISH[1].name
    shutil.copy(ENGLISH[1], path)
    nb = nbformat.read(path, as_version=4)
    nb.cells.append(nbformat.v4.new_markdown_cell("A new closing remark."))
    nbformat.write(nb, path)
    locale = tmp_path / "locale"
    locale.mkdir()
    shutil.copy(translate.po_path("01"), locale / "01.po")
    counts = translate.update("01", translate._unique(translate.notebook_sources(path)), locale=locale)
    assert counts["new"] == 1 and counts["fuzzy"] == 0
    assert any(
        "not translated" in p
        for p in translate.problems("01", translate._unique(translate.notebook_sources(path)), locale=locale)
    )


@pytest.mark.parametrize(
    "english, chinese, words",
    [
        ("Cache 1,024 tokens.", "缓存 1024 个词元。", "number"),
        ("Call `split_heads` first.", "先调用 `split_head`。", "inline code"),
        ("Divide by $\\sqrt{d_k}$.", "除以 $\\sqrt{d}$。", "formula"),
        ("See [notebook 02](02_multi_head_attention.ipynb).", "见[笔记本 02](02_x.ipynb)。", "link target"),
        ("## 3. Padding masks", "## 填充掩码", "Markdown structure"),
        ("**Prerequisites:** notebook 01.", "**先修知识：**笔记本 01。", "Markdown structure"),
        ("{name}: correct on {n} cases", "{name}：全部正确", "placeholder {n}"),
        ("The KV cache grows.", "缓存会增长。", "KV cache"),
        ("Use PyTorch here.", "在这里使用PyTorch。", "typography"),
        ("First, the mask.", "首先,掩码。", "typography"),
    ],
)
def test_the_lint_sees_each_kind_of_damage(english, chinese, words):
    assert any(words in p for p in translate.entry_problems(english, chinese))


def test_the_lint_passes_a_faithful_translation():
    english = "## 3. Padding masks\n\nThe **KV cache** of `x` holds 1,024 tokens; see [02](02_a.ipynb) and $\\sqrt{d}$."
    chinese = "## 3. 填充掩码\n\n`x` 的**键值缓存**保存 1,024 个词元；见 [02](02_a.ipynb) 和 $\\sqrt{d}$。"
    assert translate.entry_problems(english, chinese) == []


def test_every_glossary_term_has_one_chinese_and_the_readme_lists_them():
    from mha_course.kit import course_map

    english = [en for en, _, _ in course_map.GLOSSARY]
    assert len(english) == len(set(english)) >= 60
    for term in ("缩放点积注意力", "键值缓存", "旋转位置编码", "分组查询注意力", "张量并行"):
        assert term in {zh for _, zh, _ in course_map.GLOSSARY}
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert all(f"| {en} | {zh} |" in readme for en, zh, _ in course_map.GLOSSARY)


def test_quiz_sections_name_headings_of_the_chinese_notebook():
    """A quiz's "see *section*" points at a heading the Chinese reader can find."""
    for path in translate.zh_notebooks():
        nb = nbformat.read(path, as_version=4)
        headings = {
            re.sub(r"^#+\s*", "", line).strip()
            for c in nb.cells
            if c.cell_type == "markdown"
            for line in notebook_tools._source(c).splitlines()
            if line.startswith("#")
        }
        mc.set_language("zh")
        try:
            quiz = mc.quiz.load(path.stem[:2])
        except ValueError:
            continue
        finally:
            mc.set_language("en")
        for q in quiz["questions"]:
            assert q["section"] in headings, f"{path.name}: quiz section {q['section']!r} is no heading"


def test_the_seeds_names_are_chinese_in_the_chinese_prose():
    zh01 = "\n".join(translate.translation_table("01").values())
    zh02 = "\n".join(translate.translation_table("02").values())
    assert "张三" in zh01 and "李四" in zh01 and "小明" in zh02 and "小红" in zh02


# ---------------------------------------------------------------------------------------------
# the package in Chinese


def test_set_language_accepts_the_usual_spellings_and_names_a_wrong_one():
    assert mc.set_language("zh-CN") == "zh" and mc.language() == "zh"
    assert mc.set_language("zh_Hans") == "zh"
    assert mc.set_language("en") == "en"
    with pytest.raises(ValueError, match=r"language should be one of \['en', 'zh'\].*'fr'"):
        mc.set_language("fr")
    with pytest.raises(TypeError, match="language should be a string"):
        mc.set_language(None)


def test_the_environment_variable_sets_the_starting_language(monkeypatch):
    monkeypatch.setenv(i18n.LANGUAGE_VARIABLE, "zh")
    i18n._start_language()
    assert mc.language() == "zh"
    monkeypatch.setenv(i18n.LANGUAGE_VARIABLE, "klingon")
    with pytest.warns(UserWarning, match="MHA_COURSE_LANG='klingon'"):
        i18n._start_language()


def test_quiz_predictions_and_hints_speak_chinese_and_keep_their_answers():
    english = mc.quiz.load("05")
    mc.set_language("zh")
    chinese = mc.quiz.load("05")
    assert [[o["correct"] for o in q["options"]] for q in chinese["questions"]] == [
        [o["correct"] for o in q["options"]] for q in english["questions"]
    ]
    assert all(re.search(r"[\u4e00-\u9fff]", q["question"]) for q in chinese["questions"])
    assert "自测题" in mc.quiz.static_markdown(chinese)
    from mha_course.kit import hint_ladder, predict

    assert re.search(r"[\u4e00-\u9fff]", predict.static_markdown(predict.load("05")["fully_masked_row"]))
    hint_ladder.reset()
    assert hint_ladder.next_hint("5.1").startswith("练习 5.1，提示 1/")
    mc.set_language("en")
    hint_ladder.reset()
    assert hint_ladder.next_hint("5.1").startswith("Exercise 5.1, hint 1 of")


def test_a_checkers_verdict_in_chinese_names_the_same_mistake():
    import torch

    def not_attempted(x):
        raise NotImplementedError

    def columns(x):  # a known mistake: normalises each column
        return x / x.sum(dim=0, keepdim=True)

    english = repr(mc.check.normalize_rows(columns))
    mc.set_language("zh")
    assert repr(mc.check.normalize_rows(not_attempted)).startswith("⏳ 未尝试 · normalize_rows：")
    chinese = repr(mc.check.normalize_rows(columns))
    right = repr(mc.check.normalize_rows(lambda x: x / x.sum(dim=-1, keepdim=True)))
    assert chinese.startswith("❌ 未通过 · normalize_rows：可能的错误") and "第 1 个用例（共 4 个）" in chinese
    assert "likely mistake" in english and "likely mistake" not in chinese
    assert right.startswith("✅ 通过 · normalize_rows：") and "4" in right
    assert mc.verify.proof_line("a == b", torch.zeros(2), torch.zeros(2)) == "✅ 通过 · a == b: 最大绝对误差 < 1e-06"


def test_every_diagnosis_has_its_chinese():
    table = json.loads((ROOT / "mha_course/check/diagnoses.json").read_text(encoding="utf-8"))
    chinese = translate.translation_table("messages")
    missing = [
        f"{c} {n}"
        for c, words in table.items()
        for n, text in words.items()
        if (f"diagnosis {c} {n}", text) not in chinese
    ]
    assert not missing


def test_figure_texts_are_translated_with_their_values_filled_in():
    mc.set_language("zh")
    assert i18n.figure_text("key position") != "key position"
    # an f-string's template: the values drawn are kept, the words translated
    template = next(
        m for (c, m) in translate.translation_table("messages") if c == "figure" and "{0}" in m and "{1}" in m
    )
    drawn = template.format(*(f"<{k}>" for k in range(9)))  # what the f-string draws, values <0>, <1> …
    zh = i18n.figure_text(drawn)
    assert zh != drawn and "<0>" in zh and "<1>" in zh
    mc.set_language("en")
    assert i18n.figure_text("key position") == "key position"


def test_a_chinese_figure_draws_every_glyph_with_the_shipped_font():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    text = "".join(v for (c, _), v in translate.translation_table("messages").items() if c == "figure")
    with matplotlib.rc_context():  # the font setting stays inside this test
        mc.setup(language="zh")
        fig, ax = plt.subplots()
        ax.set_title("key position")
        ax.set_xlabel(text[:400])
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # matplotlib warns "Glyph … missing from font(s)"
            fig.canvas.draw()
        assert re.search(r"[\u4e00-\u9fff]", ax.get_title())
        plt.close(fig)


def test_the_figure_font_covers_every_translated_figure_character():
    fontTools = pytest.importorskip("fontTools.ttLib")
    font = fontTools.TTFont(translate.FIGURE_FONT)
    missing = sorted(set(translate.figure_characters()) - {chr(c) for c in font.getBestCmap()})
    assert not missing, f"remake the font: python -m authoring translate --font PATH (missing {''.join(missing)})"
    assert (translate.FIGURE_FONT.parent / "LICENSE.txt").exists()
    assert translate.FIGURE_FONT.stat().st_size < 1_500_000


# ---------------------------------------------------------------------------------------------
# the Chinese notebooks


@pytest.mark.parametrize("english", ENGLISH, ids=lambda p: p.stem)
def test_each_notebook_has_a_chinese_twin_as_the_build_writes_it(english):
    """Same cells, same code (the setup cell speaking Chinese), the Markdown from the catalogue:
    `python -m authoring translate --build NN`, then execute, brings a stale twin up to date."""
    path = translate.ZH_DIR / english.name
    assert path.exists(), f"run python -m authoring translate --build {english.stem[:2]}, then execute it"
    committed = nbformat.read(path, as_version=4)
    built = translate.zh_notebook(english)
    assert [c.id for c in committed.cells] == [c.id for c in built.cells]
    for a, b in zip(committed.cells, built.cells, strict=True):
        assert notebook_tools._source(a) == notebook_tools._source(b), f"cell {a.id} is stale"
    source = nbformat.read(english, as_version=4)
    code = [notebook_tools._source(c) for c in source.cells if c.cell_type == "code"]
    twin = [notebook_tools._source(c) for c in committed.cells if c.cell_type == "code"]
    assert [a == b for a, b in zip(code, twin, strict=True)].count(False) == 1, "only the setup cell differs"


def test_the_chinese_notebooks_speak_chinese_in_their_outputs():
    nb = nbformat.read(translate.ZH_DIR / "00_setup_check.ipynb", as_version=4)
    shown = json.dumps([c.get("outputs", []) for c in nb.cells], ensure_ascii=False)
    assert "未尝试" in shown and "可能的错误" in shown and "自测题" in shown
