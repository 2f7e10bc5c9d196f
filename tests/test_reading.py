"""Every notebook is one sitting, and its prose says what its outputs say.

The rules and their arithmetic live in authoring/reading.py; these tests apply them to every
numbered notebook, and check the arithmetic itself on small notebooks built here.
"""

import re

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from authoring import notebooks as notebook_tools
from authoring import reading
from authoring import student_edition as se

NOTEBOOKS = notebook_tools.numbered_notebooks()


def _read(path):
    return nbformat.read(path, as_version=4)


# ---------------------------------------------------------------------------------------------
# the arithmetic, on notebooks whose answer is known


def _nb(*cells):
    return new_notebook(cells=list(cells))


def test_reading_counts_core_and_deep_dive_words_cells_and_exercise_minutes():
    nb = _nb(
        new_markdown_cell("# Title\n\none two three"),  # 4 words
        new_code_cell("x = 1"),
        new_markdown_cell("## 1. Core\n\n### Exercise 1.1 — do it (10 min)\n\nfour five"),
        new_code_cell("y = 2"),
        new_markdown_cell("## 2. More (deep dive)\n\n" + "w " * 130),
        new_code_cell("z = 3"),
        new_markdown_cell("### Exercise 1.2 — later (5 min)"),  # inside the deep dive
        new_markdown_cell("## Summary\n\n[link text](https://example.org) ![badge](https://example.org/b.svg)"),
    )
    r = reading.reading(nb)
    # words hold a letter or digit ("#" and "—" are not words; link targets and images are not read):
    # "Title one two three"; "1. Core", "Exercise 1.1 do it (10 min)", "four five"; "Summary [link text]"
    core_words = 4 + (2 + 6 + 2) + (1 + 2)
    assert r.core_words == core_words
    assert r.words == core_words + (4 + 130) + 5  # "2. More (deep dive)" and its text; "Exercise 1.2 later (5 min)"
    assert (r.code_cells, r.core_code_cells) == (3, 2)
    assert (r.exercise_minutes, r.core_exercise_minutes) == (15, 10)
    assert r.exercises == {"1.1": 10, "1.2": 5}
    assert r.core_minutes == pytest.approx(core_words / 130 + 2 * 0.5 + 10)
    assert not r.unstated_exercises


def test_reading_reports_an_exercise_without_a_stated_time():
    r = reading.reading(_nb(new_markdown_cell("## 3. Exercise 9.1: the update")))
    assert r.unstated_exercises == ["## 3. Exercise 9.1: the update"]


def _with_output(source, text):
    cell = new_code_cell(source)
    cell.outputs = [new_output("stream", name="stdout", text=text)]
    return cell


def test_a_prose_number_must_be_shown_by_its_own_section():
    nb = _nb(
        new_markdown_cell("## 1. One\n\nThe weight is 0.083 and the loss 2.08."),
        _with_output("print(w)", "weight 0.0834\n"),
        new_markdown_cell("## 2. Two\n\nHere the ratio is 24.5 ms."),
        _with_output("print(t)", "2.079\n"),  # section 2 prints 2.079, too late for section 1
    )
    found = [(section, number) for section, number, _ in reading.unbound_numbers(nb)]
    assert found == [("## 1. One", "2.08"), ("## 2. Two", "24.5")]


def test_markers_citations_names_and_summaries_exempt_numbers():
    nb = _nb(
        new_markdown_cell(
            "## 1. One\n\nThe learning rate is 0.01. <!-- given, not measured -->\n\n"
            "Voita et al. (2019) keep 38 of 48 heads for 0.15 BLEU.\n\n"
            "Exercise 4.1 uses Llama 3.1's settings and PyTorch ≥ 2.5.\n\n"
            "About 12.5 % of the runs."
        ),
        _with_output("print(share)", "0.125\n"),
        new_markdown_cell("## Summary\n\nThe weight was 0.083."),
        _with_output("pass", ""),
    )
    nb.cells.insert(1, _with_output("print(w)", "0.083\n"))
    assert reading.unbound_numbers(nb) == []
    nb.cells[0].source = nb.cells[0].source.replace(" <!-- given, not measured -->", "")
    assert [n for _, n, _ in reading.unbound_numbers(nb)] == ["0.01"]


def test_minutes_round_half_up():
    assert [reading.minutes(x) for x in (44.49, 44.5, 45.0)] == [44, 45, 45]


# ---------------------------------------------------------------------------------------------
# every notebook


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_core_path_is_one_sitting_and_the_header_states_it(path):
    nb = _read(path)
    r = reading.reading(nb)
    assert r.core_minutes <= reading.MAX_CORE_MINUTES, (
        f"{path.stem}: core path {r.core_minutes:.1f} min ({r.core_words} words, {r.core_code_cells} code cells, "
        f"{r.core_exercise_minutes} min of exercises) > {reading.MAX_CORE_MINUTES}"
    )
    stated = reading.stated_times(nb)
    assert stated, (
        f"{path.stem}: the header needs '**Estimated time:** core path ≈ X min; with the deep dives ≈ Y min.'"
    )
    computed = (reading.minutes(r.core_minutes), reading.minutes(r.all_minutes))
    assert stated == computed, f"{path.stem}: the header states {stated} min, the notebook computes {computed}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_notebook_holds_more_than_one_sittings_prose(path):
    words = reading.reading(_read(path)).words
    assert words <= reading.MAX_WORDS, f"{path.stem}: {words:,} words of prose > {reading.MAX_WORDS:,}"


def test_every_exercise_states_its_time_in_its_heading():
    stated = {path.stem: reading.reading(_read(path)).exercises for path in NOTEBOOKS}
    missing = [f"{e.notebook}: Exercise {e.number}" for e in se.exercises() if e.number not in stated[e.notebook]]
    assert not missing, "exercise headings without '(N min)': " + ", ".join(missing)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_number_in_the_prose_is_one_an_output_of_its_section_shows(path):
    found = reading.unbound_numbers(_read(path))
    assert not found, f"{path.stem}: prose numbers no output of their section shows:\n" + "\n".join(
        f"  {number} in {section}: …{context}…" for section, number, context in found
    )


MYTH = re.compile(r"You may have read|\*\*Myth\b", re.I)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_myth_boxes_close_their_section(path):
    """After a myth box only its own demonstration follows (code and takeaways) until the next heading,
    and it never stands between a sentence that announces an output (ends with ':') and that output."""
    cells = _read(path).cells
    for i, cell in enumerate(cells):
        if cell.cell_type != "markdown" or not MYTH.search(cell.source):
            continue
        before = cell.source[: MYTH.search(cell.source).start()].rstrip()
        if not before and i > 0 and cells[i - 1].cell_type == "markdown":
            before = cells[i - 1].source.rstrip()
        assert not before.endswith(":"), (
            f"{path.stem} cell {i}: a myth box right after an announcement ({before[-60:]!r})"
        )
        for later in cells[i + 1 :]:
            if later.cell_type == "code":
                continue
            heading = re.search(r"^#", later.source, re.M)
            rest = later.source[: heading.start() if heading else None].strip()
            assert not rest or rest.startswith("*Takeaway"), (
                f"{path.stem} cell {i}: the myth box is followed by more of its section ({rest[:60]!r}); "
                "move it to the section's end"
            )
            if heading:
                break


def test_workshop_pauses_are_never_shorter_than_the_exercise_they_are_for():
    stated = {}
    for path in NOTEBOOKS:
        stated.update(reading.reading(_read(path)).exercises)
    guide = (notebook_tools.ROOT / "docs" / "instructor_guide.md").read_text(encoding="utf-8")
    pauses = re.findall(r"Pause (\d+) min: Exercises? (\d+\.\d+)(?: and (\d+\.\d+))?", guide)
    assert len(pauses) >= 5, "the agendas' pauses were not found"
    for minutes, first, second in pauses:
        needed = stated[first] + (stated[second] if second else 0)
        assert int(minutes) >= needed, f"the guide pauses {minutes} min for Exercise {first}, which states {needed} min"


def test_scales_and_the_precision_written_decide_what_an_output_shows():
    shown = reading._shown
    assert shown("41.9", "numel 41,943,040 per layer", "M") and not shown("41.9", "numel 42,943,040", "M")
    assert shown("805", "saves 805 M parameters", "M")  # a scale printed after the output's number
    assert shown("131,000", "reach 131,072 tokens") and not shown("131,000", "reach 132,072 tokens")
    assert not shown("2,048", "2,049 tokens")  # a grouped integer without trailing zeros is exact
    assert shown("12.5", "share 0.125") and not shown("12.5", "share 0.135")  # a percentage of a fraction
    assert shown("0.08", "0.0834") and not shown("0.083", "0.0844")
