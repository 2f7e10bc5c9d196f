"""Each notebook assesses once and fairly: a "predict, then run" question is not answered above
its prompt and is settled by a named output after it; "Check your understanding" asks only open
questions (explain, derive, sketch) and never one that the notebook's quiz already asks."""

from __future__ import annotations

import json
import re

import pytest

from authoring import notebooks as notebook_tools
from mha_course.kit import predict, quiz

NOTEBOOKS = notebook_tools.numbered_notebooks()
PREDICT_CALL = re.compile(r"""mc\.predict\(\s*["'](\d\d)["']\s*,\s*["']([\w-]+)["']\s*\)""")


def _cells(path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def _output_text(cell: dict) -> str:
    """The stored text of a code cell's outputs (streams, text/plain and text/markdown)."""
    parts = []
    for out in cell.get("outputs", []):
        if out.get("output_type") == "stream":
            parts.append("".join(out.get("text", "")))
        for kind in ("text/plain", "text/markdown"):
            if kind in out.get("data", {}):
                parts.append("".join(out["data"][kind]))
    return "\n".join(parts)


def _tokens(text: str) -> list[str]:
    """Words and numbers, lower case, in order: '0.450 / 0.450' and '0.450, 0.450' read the same."""
    return re.findall(r"\d+(?:[.,]\d+)*|[^\W\d_]+", text.lower().replace("·", " "))


def _contains(haystack: list[str], needle: list[str]) -> bool:
    n = len(needle)
    return n > 0 and any(haystack[i : i + n] == needle for i in range(len(haystack) - n + 1))


def _prompts(path):
    """(cell index, notebook key, prediction key) of every prompt in a notebook."""
    for index, cell in enumerate(_cells(path)):
        if cell["cell_type"] == "code":
            for m in PREDICT_CALL.finditer("".join(cell["source"])):
                yield index, m.group(1), m.group(2)


PROMPTS = [(path, *prompt) for path in NOTEBOOKS for prompt in _prompts(path)]


def settling_problems(path, index: int, question: dict) -> list[str]:
    """What is wrong with how a prompt (code cell ``index`` of ``path``) is settled and protected."""
    problems = []
    if "answer" not in question or "settled_by" not in question:
        return ["needs 'answer' and 'settled_by' in its predictions file"]
    cells = _cells(path)
    cell_part, says = question["settled_by"]["cell"], question["settled_by"]["says"]
    later = [
        i
        for i in range(index + 1, len(cells))
        if cells[i]["cell_type"] == "code" and cell_part in "".join(cells[i]["source"])
    ]
    if not later:
        problems.append(f"no code cell after the prompt contains {cell_part!r}")
    elif says not in _output_text(cells[later[0]]):
        problems.append(f"cell {later[0]} (the first after the prompt with {cell_part!r}) does not print {says!r}")
    text = ["".join(c["source"]) if c["cell_type"] == "markdown" else _output_text(c) for c in cells[: index + 1]]
    if _contains(_tokens("\n".join(text)), _tokens(says)):  # the prompt's own output included
        problems.append(f"the notebook says {says!r} above the prompt")
    if question.get("options") and isinstance(question["answer"], int):
        right = question["options"][question["answer"]]
        if _contains(_tokens("\n".join(text[:index])), _tokens(right)):  # the prompt lists every option
            problems.append(f"the correct option {right!r} is written above the prompt")
    return problems


def test_prediction_answers_and_settling_cells_are_validated():
    good = {"question": "Which?", "options": ["one", "two"], "answer": 1, "settled_by": {"cell": "f(", "says": "two"}}
    assert predict.validate({"a": good}) == []
    assert predict.validate({"a": {"question": "How many?", "unit": "GiB", "answer": 1.5}}) == []
    for bad, words in [
        ({"answer": 2}, "option index 0..1"),
        ({"answer": True}, "must be a number"),
        ({"answer": "b"}, "must be a number"),
        ({"settled_by": {"cell": "f("}}, "'settled_by' must be"),
        ({"settled_by": {"cell": "f(", "says": ""}}, "non-empty"),
        ({"settled_by": "f("}, "'settled_by' must be"),
    ]:
        (problem,) = predict.validate({"a": {**good, **bad}})
        assert words in problem, problem
    assert "two" not in predict.static_markdown(good).split("**b)**")[0]  # nothing but the options


def test_the_settling_check_finds_each_spoiler(tmp_path):
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_markdown_cell("# 05 · Toy\n\nObjectives: see that the weights are **0.450 / 0.450**."),
        nbformat.v4.new_code_cell('mc.predict("05", "w")'),
        nbformat.v4.new_code_cell("print(weights)"),
    ]
    nb.cells[2].outputs = [nbformat.v4.new_output("stream", name="stdout", text="weights: 0.450, 0.450\n")]
    path = tmp_path / "05_toy.ipynb"
    nbformat.write(nb, path)
    q = {"question": "?", "options": ["about 0.9", "about 0.45 each"], "answer": 1}
    assert settling_problems(path, 1, q) == ["needs 'answer' and 'settled_by' in its predictions file"]
    q["settled_by"] = {"cell": "print(weights)", "says": "0.450, 0.450"}
    assert settling_problems(path, 1, q) == ["the notebook says '0.450, 0.450' above the prompt"]
    nb.cells[0].source = "# 05 · Toy\n\nThe two weights come out about 0.45 each."
    nbformat.write(nb, path)
    assert settling_problems(path, 1, q) == ["the correct option 'about 0.45 each' is written above the prompt"]
    nb.cells[0].source = "# 05 · Toy"
    nbformat.write(nb, path)
    assert settling_problems(path, 1, q) == []
    q["settled_by"] = {"cell": "print(weights)", "says": "0.500"}
    assert "does not print '0.500'" in settling_problems(path, 1, q)[0]
    q["settled_by"] = {"cell": "plot(", "says": "0.450"}
    assert "no code cell after the prompt" in settling_problems(path, 1, q)[0]


@pytest.mark.parametrize("path,index,notebook,key", PROMPTS, ids=lambda v: getattr(v, "stem", str(v)))
def test_each_prediction_is_settled_after_its_prompt_and_not_answered_before_it(path, index, notebook, key):
    assert settling_problems(path, index, predict.load(notebook)[key]) == []


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_prediction_of_a_notebook_records_its_answer_and_what_settles_it(path):
    for key, q in predict.course_data.read("predictions", path.stem, predict.validate, missing_ok=True).items():
        assert "answer" in q and "settled_by" in q, (
            f"predictions/{path.stem[:2]}.json: {key} needs 'answer' and 'settled_by'"
        )


# ---------------------------------------------------------------------------------------------
# "Check your understanding": open questions only, none that the quiz asks

# An open question asks for reasons, a derivation or a construction, not for a value to pick.
OPEN = re.compile(
    r"\b(why|explain|sketch|derive|show|describe|draw|design|argue|justify|prove)\b"
    r"|\bhow (would|do|does|did|can|could|is|are)\b",
    re.I,
)
STOP = set(
    """a an the of to in on at by for with from and or not no is are was be been it its this that these those
    what which who whom how why when where does do did can could would should will you your yours one two
    than then there here as into out up down each every all any some more most less same other only just
    also so if but about over under between after before we our they their them he she his her i me my
    has have had get gets got very much many such own mc""".split()
)


def _words(text: str) -> set[str]:
    """Content words of a question: lower case, no stop words, a trailing plural 's' dropped."""
    words = re.findall(r"[a-z][a-z_']+|\d+(?:\.\d+)?", text.lower())
    return {w[:-1] if len(w) > 3 and w.endswith("s") and not w.endswith("ss") else w for w in words if w not in STOP}


def cyu_questions(path) -> list[str]:
    """The questions of a notebook's '## Check your understanding' section, answers removed."""
    text = "\n".join("".join(c["source"]) for c in _cells(path) if c["cell_type"] == "markdown")
    m = re.search(r"^## Check your understanding[^\n]*\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    if not m:
        return []
    body = re.sub(r"<details>.*?</details>", "", m.group(1), flags=re.S)
    items = re.split(r"^\s*\d+\.\s+", body, flags=re.M)[1:]
    return [" ".join(item.split()) for item in items if item.strip()]


def overlap(a: str, b: str) -> float:
    """Shared content words over the smaller question's content words (1 = one contains the other)."""
    wa, wb = _words(a), _words(b)
    return len(wa & wb) / max(1, min(len(wa), len(wb)))


REPEAT = 0.4  # 2 in 5 of the shorter question's content words shared: the same question (related open
# questions of the course share at most about 0.3; the repeats it was written against shared 0.4 to 1.0)


def cyu_problems(cyu: list[str], quiz_questions: list[str]) -> list[str]:
    problems = []
    for i, q in enumerate(cyu, 1):
        if not OPEN.search(q):
            problems.append(
                f"CYU {i} asks for a value, not a reason (ask why, explain, derive, sketch, show): {q[:70]!r}"
            )
        for j, asked in enumerate(quiz_questions, 1):
            if overlap(q, asked) >= REPEAT:
                problems.append(f"CYU {i} repeats quiz Q{j} (overlap {overlap(q, asked):.2f}): {q[:70]!r}")
    return problems


def test_the_repeat_finder_tells_a_repeat_from_a_related_open_question():
    asked = [
        "Two heads of your model stay identical through training. A colleague suggests re-running with "
        "another random seed. What happens?",
        "In this course, what does True mean in a boolean attention mask?",
    ]
    repeat = "Two heads stay identical through training. Why doesn't gradient descent separate them?"
    assert cyu_problems([repeat], asked) == [f"CYU 1 repeats quiz Q1 (overlap 0.56): {repeat[:70]!r}"]
    closed = "In this course, what does `True` mean in a boolean attention mask?"
    assert cyu_problems([closed], asked) == [
        f"CYU 1 asks for a value, not a reason (ask why, explain, derive, sketch, show): {closed[:70]!r}",
        f"CYU 1 repeats quiz Q2 (overlap 1.00): {closed[:70]!r}",
    ]
    related = "Explain why a symmetric start makes two heads receive equal gradients, and sketch one way to break it."
    assert cyu_problems([related], asked) == []


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_check_your_understanding_asks_open_questions_the_quiz_does_not(path):
    cyu = cyu_questions(path)
    if not cyu:
        return  # a notebook may merge its check into the quiz
    assert 1 <= len(cyu) <= 5, f"{path.stem}: {len(cyu)} questions under 'Check your understanding'"
    asked = [q["question"] for q in quiz.load(path.stem[:2])["questions"]]
    assert cyu_problems(cyu, asked) == []
