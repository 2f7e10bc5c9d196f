"""The quizzes are fair course-wide: the form of an option tells nothing about whether it is right.

Read over every ``mha_course/kit/quizzes/*.json`` together:

* **length rank** — rank the four options of a question by length (1 = longest … 4 = shortest; of two
  options of equal length the earlier one ranks first). Across the course each rank is the correct
  option's rank in 15 %–35 % of the questions (chance is 25 %): neither "pick the longest" nor
  "never pick the longest" beats chance;
* **absolute words** — the correct option is never the only one of its question without an absolute
  word ("no", "only", "never", "always", "all", "cannot", "raises", …), nor the only one with one:
  "reject the absolutes" beats no quiz;
* **real misconceptions** — every distractor names, in its ``"misconception"`` field, the mistaken
  idea it stands for, in a phrase (three words or more) that the course itself names: it appears,
  case-insensitively, in some notebook's Markdown or in ``mha_course/check/diagnoses.json``. No
  straw men: a distractor is a mistake someone makes, and the course says where.

``python -m tests.test_fairness`` (from the repository root) prints the length-rank table.
"""

from __future__ import annotations

import json
import re
from importlib import resources
from pathlib import Path

import pytest

from authoring import notebooks as notebook_tools

ROOT = Path(__file__).resolve().parents[1]
QUIZ_DIR = Path(str(resources.files("mha_course.kit.quizzes")))
QUIZ_FILES = sorted(QUIZ_DIR.glob("[0-9][0-9].json"))
DIAGNOSES = ROOT / "mha_course" / "check" / "diagnoses.json"

RANK_SHARE = (0.15, 0.35)  # each length rank's share of the correct options, course-wide
ABSOLUTE = re.compile(
    r"\b(no|not|only|never|always|nothing|none|every|everything|all|cannot|must|raises?|whatever|impossible)\b"
    r"|n't\b",
    re.I,
)
MIN_WORDS = 3  # a misconception is named in a phrase, not by one word


def _questions() -> list[tuple[str, int, dict]]:
    """(quiz key, question number, question) for every question of every quiz."""
    found = []
    for path in QUIZ_FILES:
        data = json.loads(path.read_text(encoding="utf-8"))
        found += [(path.stem, i, q) for i, q in enumerate(data["questions"], 1)]
    return found


QUESTIONS = _questions()


def _answer(q: dict) -> int:
    return [o["correct"] for o in q["options"]].index(True)


def length_rank(texts: list[str], answer: int) -> int:
    """The rank of option ``answer`` by length: 1 = longest; an earlier option of equal length ranks first."""
    order = sorted(range(len(texts)), key=lambda j: (-len(texts[j]), j))
    return order.index(answer) + 1


def rank_table(questions) -> dict[int, int]:
    """How many questions have their correct option at each length rank 1–4."""
    counts = dict.fromkeys(range(1, 5), 0)
    for _, _, q in questions:
        counts[length_rank([o["text"] for o in q["options"]], _answer(q))] += 1
    return counts


def format_table(counts: dict[int, int]) -> str:
    n = sum(counts.values())
    names = {1: "longest", 2: "2nd longest", 3: "2nd shortest", 4: "shortest"}
    lines = [f"correct option's length rank over {n} questions"]
    lines += [f"  {r} ({names[r]:>12}): {c:3d}  {c / n:5.1%}" for r, c in counts.items()]
    return "\n".join(lines)


def rank_problems(counts: dict[int, int]) -> list[str]:
    n = sum(counts.values())
    low, high = RANK_SHARE
    return [
        f"rank {r} holds the correct option in {c} of {n} questions ({c / n:.0%}; allowed {low:.0%}–{high:.0%})"
        for r, c in counts.items()
        if not low <= c / n <= high
    ]


def absolute_problems(texts: list[str], answer: int) -> list[str]:
    """The correct option is the only one without an absolute word, or the only one with one."""
    has = [bool(ABSOLUTE.search(t)) for t in texts]
    others = [h for j, h in enumerate(has) if j != answer]
    if not has[answer] and all(others):
        return ["the correct option is the only one without an absolute word"]
    if has[answer] and not any(others):
        return ["the correct option is the only one with an absolute word"]
    return []


def _normalise(text: str) -> str:
    return " ".join(re.sub(r"[`*]", "", text).lower().split())


def course_text() -> str:
    """Every notebook's Markdown and every diagnosis the checkers give, normalised for searching."""
    parts = []
    for path in notebook_tools.numbered_notebooks():
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        parts += ["".join(c["source"]) for c in cells if c["cell_type"] == "markdown"]

    def strings(value):
        if isinstance(value, str):
            yield value
        elif isinstance(value, dict):
            for k, v in value.items():
                yield k
                yield from strings(v)
        elif isinstance(value, list):
            for v in value:
                yield from strings(v)

    parts += strings(json.loads(DIAGNOSES.read_text(encoding="utf-8")))
    return "\n".join(_normalise(p) for p in parts)


def misconception_problems(q: dict, corpus: str) -> list[str]:
    problems = []
    for j, o in enumerate(q["options"]):
        letter = chr(97 + j)
        phrase = o.get("misconception")
        if o["correct"]:
            if phrase is not None:
                problems.append(f"{letter}) is the correct option but names a misconception")
            continue
        if not isinstance(phrase, str) or len(phrase.split()) < MIN_WORDS:
            problems.append(f"{letter}) needs a 'misconception' of {MIN_WORDS} words or more, has {phrase!r}")
        elif _normalise(phrase) not in corpus:
            problems.append(f"{letter}) misconception {phrase!r} is named in no notebook's Markdown nor diagnosis")
    return problems


# ---------------------------------------------------------------------------------------------


def test_the_rules_catch_each_tell():
    assert length_rank(["aaa", "a", "aa", "aaaa"], 3) == 1
    assert length_rank(["aa", "aa", "a", "a"], 1) == 2 and length_rank(["aa", "aa", "a", "a"], 3) == 4
    assert rank_problems({1: 2, 2: 6, 3: 6, 4: 6}) == [
        "rank 1 holds the correct option in 2 of 20 questions (10%; allowed 15%–35%)"
    ]
    assert rank_problems({1: 5, 2: 5, 3: 5, 4: 5}) == []
    assert absolute_problems(["No: never", "Only this", "It depends on d", "All heads"], 2) == [
        "the correct option is the only one without an absolute word"
    ]
    assert absolute_problems(["it can", "it cannot", "it may", "it might"], 1) == [
        "the correct option is the only one with an absolute word"
    ]
    assert absolute_problems(["No: never", "Only this", "It depends on d", "the rest"], 2) == []
    assert absolute_problems(["it doesn't", "a", "b", "c"], 0) == [
        "the correct option is the only one with an absolute word"
    ]
    corpus = _normalise("Many think that **the scale is √d_model**, and some that masks are `additive`.")
    q = {
        "options": [
            {"text": "x", "correct": True, "explanation": "."},
            {"text": "y", "correct": False, "explanation": ".", "misconception": "the scale is √d_model"},
            {"text": "z", "correct": False, "explanation": ".", "misconception": "masks"},
            {"text": "w", "correct": False, "explanation": ".", "misconception": "heads read different tokens"},
        ]
    }
    assert misconception_problems(q, corpus) == [
        "c) needs a 'misconception' of 3 words or more, has 'masks'",
        "d) misconception 'heads read different tokens' is named in no notebook's Markdown nor diagnosis",
    ]


def test_every_quiz_file_is_read_and_every_question_has_four_options():
    assert len(QUIZ_FILES) >= 16 and len(QUESTIONS) >= 64
    for key, i, q in QUESTIONS:
        assert len(q["options"]) == 4, f"quiz {key} Q{i}: {len(q['options'])} options (the length rank needs 4)"


def test_course_wide_the_correct_option_s_length_rank_is_spread_as_chance():
    counts = rank_table(QUESTIONS)
    print()
    print(format_table(counts))
    assert rank_problems(counts) == []


def test_in_chinese_too_the_correct_option_s_length_rank_is_spread_as_chance():
    """A translation can bring the tell back (a correct option rendered more fully than the others):
    the Chinese quizzes, as the Chinese notebooks show them, are held to the same spread."""
    import mha_course as mc

    mc.set_language("zh")
    try:
        chinese = [(p.stem, i, q) for p in QUIZ_FILES for i, q in enumerate(mc.quiz.load(p.stem)["questions"], 1)]
    finally:
        mc.set_language("en")
    counts = rank_table(chinese)
    print()
    print(format_table(counts))
    assert rank_problems(counts) == []


@pytest.mark.parametrize("key", [p.stem for p in QUIZ_FILES])
def test_the_correct_option_is_not_told_by_absolute_words(key):
    problems = [
        f"quiz {key} Q{i}: {p}"
        for k, i, q in QUESTIONS
        if k == key
        for p in absolute_problems([o["text"] for o in q["options"]], _answer(q))
    ]
    assert problems == []


@pytest.fixture(scope="module")
def corpus() -> str:
    return course_text()


@pytest.mark.parametrize("key", [p.stem for p in QUIZ_FILES])
def test_every_distractor_is_a_misconception_the_course_names(key, corpus):
    problems = [f"quiz {key} Q{i}: {p}" for k, i, q in QUESTIONS if k == key for p in misconception_problems(q, corpus)]
    assert problems == []


if __name__ == "__main__":
    print(format_table(rank_table(QUESTIONS)))
    corpus_text = course_text()
    for key, i, q in QUESTIONS:
        texts, a = [o["text"] for o in q["options"]], _answer(q)
        flags = absolute_problems(texts, a) + misconception_problems(q, corpus_text)
        print(f"{key} Q{i}: {chr(97 + a)}) rank {length_rank(texts, a)}", "; ".join(flags)[:150])
