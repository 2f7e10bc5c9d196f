"""How long a notebook takes to read, computed from the notebook itself.

A notebook's **core path** is everything outside its ``(deep dive)`` sections. Its time is

    prose words / 130 per minute  +  30 s per code cell  +  each core exercise's stated time

where an exercise states its time in its heading: ``### Exercise 7.1 — ablate heads (10 min)``.
The header's ``**Estimated time:** core path ≈ X min; with the deep dives ≈ Y min.`` must give
these numbers, rounded to the minute (tests/test_reading.py).

    python -m authoring.reading            # a table: words, code cells, exercises, minutes,
                                           # and the prose numbers no output shows

**Prose bound to outputs.** A number in Markdown that reports a result — a decimal (0.083), a grouped
integer (1,429) or a percentage — must appear, as written or rounded to the precision written, in a
text output of a code cell of the same ``##`` section (Summary and Check-your-understanding sections
may cite any output of the notebook). A paragraph with a citation (a link, "et al.", a year) or the
marker ``<!-- given, not measured -->`` (for configuration values and constants) is exempt; a number
that is part of a name (Exercise 4.1, Llama 3.1, PyTorch 2.5) is not a result.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

WORDS_PER_MINUTE = 130
MINUTES_PER_CODE_CELL = 0.5
MAX_CORE_MINUTES = 45
MAX_WORDS = 3600

HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*$", re.M)
DEEP_DIVE = re.compile(r"\(deep dive\)", re.I)
# an exercise's heading, "## 3. Exercise 9.1: …" or "### Exercise 7.1 — … (10 min)"; its time is the
# "(N min)" in it (before a "(deep dive)" where it has one)
EXERCISE = re.compile(r"^#{2,6}\s+(?:\d+\.\s+)?Exercise\s+(\d+\.\d+)\b.*$", re.M)
EXERCISE_TIME = re.compile(r"\((\d+) min\)")
TIME_LINE = re.compile(r"\*\*Estimated time:\*\* core path ≈ (\d+) min; with the deep dives ≈ (\d+) min\.")


def prose_words(markdown: str) -> int:
    """Words a reader reads: link targets, HTML tags and images are not read."""
    text = re.sub(r"!\[[^\]]*\]\([^)]*\)", " ", markdown)  # images (badges)
    text = re.sub(r"\]\([^)]*\)", "]", text)  # link targets
    text = re.sub(r"<[^>]+>", " ", text)  # HTML tags (<details>, <summary>)
    return sum(1 for token in text.split() if re.search(r"\w", token))


@dataclass
class Part:
    """One cell, with whether it lies in a deep dive."""

    kind: str  # "markdown" or "code"
    source: str
    deep: bool


def parts(nb) -> list[Part]:
    """The notebook's cells, each marked core or deep dive.

    A heading with "(deep dive)" opens a deep dive; it lasts until the next heading of the same or a
    higher level. Text before a cell's first heading belongs to whatever the previous cell was in.
    """
    out: list[Part] = []
    deep_level: int | None = None  # level of the open deep-dive heading, if any
    for cell in nb.cells:
        source = cell.source if isinstance(cell.source, str) else "".join(cell.source)
        if cell.cell_type != "markdown":
            out.append(Part(cell.cell_type, source, deep_level is not None))
            continue
        # a markdown cell may hold several headings: split it at each one
        pos, chunks = 0, []
        for m in HEADING.finditer(source):
            chunks.append((source[pos : m.start()], deep_level is not None))
            level = len(m.group(1))
            if deep_level is not None and level <= deep_level:
                deep_level = None
            if deep_level is None and DEEP_DIVE.search(m.group(2)):
                deep_level = level
            pos = m.start()
        chunks.append((source[pos:], deep_level is not None))
        out.extend(Part("markdown", text, deep) for text, deep in chunks if text.strip())
    return out


@dataclass
class Reading:
    words: int  # all prose, deep dives included
    core_words: int
    code_cells: int
    core_code_cells: int
    exercise_minutes: int  # every exercise's stated time
    core_exercise_minutes: int
    unstated_exercises: list[str]  # exercise headings without "(N min)"
    exercises: dict[str, int]  # exercise number -> stated minutes

    @property
    def core_minutes(self) -> float:
        return (
            self.core_words / WORDS_PER_MINUTE
            + self.core_code_cells * MINUTES_PER_CODE_CELL
            + self.core_exercise_minutes
        )

    @property
    def all_minutes(self) -> float:
        return self.words / WORDS_PER_MINUTE + self.code_cells * MINUTES_PER_CODE_CELL + self.exercise_minutes


def reading(nb) -> Reading:
    r = Reading(0, 0, 0, 0, 0, 0, [], {})
    for part in parts(nb):
        if part.kind == "code":
            r.code_cells += 1
            r.core_code_cells += not part.deep
            continue
        words = prose_words(part.source)
        r.words += words
        r.core_words += 0 if part.deep else words
        for m in EXERCISE.finditer(part.source):
            t = EXERCISE_TIME.search(m.group(0))
            if t is None:
                r.unstated_exercises.append(m.group(0).strip())
                continue
            r.exercises[m.group(1)] = int(t.group(1))
            r.exercise_minutes += int(t.group(1))
            r.core_exercise_minutes += 0 if part.deep else int(t.group(1))
    return r


def stated_times(nb) -> tuple[int, int] | None:
    """(core, with deep dives) minutes from the header, or None."""
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            m = TIME_LINE.search(cell.source if isinstance(cell.source, str) else "".join(cell.source))
            if m:
                return int(m.group(1)), int(m.group(2))
    return None


def minutes(x: float) -> int:
    """Minutes as the header states them: rounded half up."""
    return int(x + 0.5)


def main() -> None:
    import nbformat

    from authoring.notebooks import numbered_notebooks

    print(
        f"{'notebook':40} {'words':>6} {'core':>6} {'cells':>5} {'ex min':>6} "
        f"{'core min':>8} {'all min':>7} {'stated':>8}"
    )
    for path in numbered_notebooks():
        nb = nbformat.read(path, as_version=4)
        r = reading(nb)
        stated = stated_times(nb)
        print(
            f"{Path(path).stem:40} {r.words:6} {r.core_words:6} {r.core_code_cells:5} {r.core_exercise_minutes:6} "
            f"{r.core_minutes:8.1f} {r.all_minutes:7.1f} {str(stated):>8}"
            + (f"  unstated: {len(r.unstated_exercises)}" if r.unstated_exercises else "")
        )
        for section, number, context in unbound_numbers(nb):
            print(f"    {number!r} in {section[:40]!r} is in no output of its section: …{context}…")


# ---------------------------------------------------------------------------------------------
# prose bound to outputs

# a number that reports a result: a decimal (0.083, 24.5), a grouped integer (1,429) or a percentage
RESULT_NUMBER = re.compile(r"(?<![\w.,/^])(?:\d{1,3}(?:,\d{3})+|\d+\.\d+|\d+(?=\s?%))(?:\.\d+)?(?![\w^]|\.\d)")
# a number that is part of a name: Exercise 4.1, Llama 3.1, PyTorch 2.5, Python 3.10, § 4.2
NAME_BEFORE = re.compile(
    r"(?:Exercises?\s+\d+\.\d+\s*(?:–|-|,|and|or)\s*|Exercise|Exercises"
    r"|Llama|PyTorch|torch|Python|Qwen\d?|Mistral|Gemma|Phi|GPT|DeepSeek|section|§|v)[\s-]*(?:≥|>=|<=|≤)?\s*$",
    re.I,
)
NOT_A_RESULT = "<!-- given, not measured -->"  # a paragraph holding this marker states no computed result
CITATION = re.compile(r"\]\(https?://|et al\.|\(\d{4}\)|\b(?:19|20)\d{2}\b")
WHOLE_NOTEBOOK_SECTIONS = re.compile(r"^##\s+(Summary|Check your understanding|Self-check quiz)", re.I)


def _plain(markdown: str) -> str:
    """Prose without what is not prose: code spans and blocks, math, link targets, HTML comments."""
    text = re.sub(r"```.*?```", " ", markdown, flags=re.S)
    text = re.sub(r"`[^`]*`", " ", text)
    text = re.sub(r"\$\$.*?\$\$|\$[^$]*\$", " ", text, flags=re.S)
    text = re.sub(r"\]\([^)]*\)", "]", text)
    return text


def _output_text(cell) -> str:
    parts = []
    for out in cell.get("outputs", []):
        if out.get("output_type") == "stream":
            parts.append(out.get("text", ""))
        elif "data" in out:
            parts.append(out["data"].get("text/plain", ""))
    return "\n".join("".join(p) if isinstance(p, list) else p for p in parts)


def _numbers(text: str) -> list[float]:
    """The numbers an output prints, each also scaled by a K/M/B written right after it ("805 M")."""
    values = []
    for m in re.finditer(r"-?\d[\d,]*\.?\d*(?:e-?\d+)?(?:\s?([KkMBG])\b)?", text):
        value = _value(m.group(0).split()[0].rstrip("KkMBG").strip(","))
        if value is not None:
            values.append(value)
            if m.group(1):
                values.append(value * SCALE[m.group(1)])
    return values


def _value(token: str) -> float | None:
    try:
        return float(token.replace(",", ""))
    except ValueError:
        return None


SCALE = {"K": 1e3, "k": 1e3, "M": 1e6, "B": 1e9, "G": 1e9}


def _shown(number: str, outputs: str, unit: str = "") -> bool:
    """Whether `number`, as written (with its precision, and scaled by a K/M/B written after it), is an
    output's number rounded: "41.9 M" is shown by 41,943,040; "12.5 %" by 0.125."""
    written = number.replace(",", "")
    # the precision written: 0.083 to the thousandth; a grouped integer to its last non-zero digit
    # ("about 131,000" is 131,072 rounded), any other integer exactly
    decimals = len(written.split(".")[1]) if "." in written else 0
    if "," in number and "." not in number:
        decimals = -(len(written) - len(written.rstrip("0")))
    scale = SCALE.get(unit, 1.0)
    target, tolerance = float(written) * scale, (0.5 * 10**-decimals + 1e-12) * scale
    for value in _numbers(outputs):
        for v in (value, value * 100):  # a fraction printed, a percentage written
            if abs(abs(v) - target) <= tolerance:
                return True
    return False


def unbound_numbers(nb) -> list[tuple[str, str, str]]:
    """(section, number, the sentence around it) for each result number no output of its section shows."""
    sections: list[tuple[str, list[str], list[str]]] = []  # (heading, prose paragraphs, outputs)
    current = ("(header)", [], [])
    sections.append(current)
    for cell in nb.cells:
        source = cell.source if isinstance(cell.source, str) else "".join(cell.source)
        if cell.cell_type == "code":
            current[2].append(_output_text(cell))
            continue
        if cell.cell_type != "markdown":
            continue
        pos = 0
        for m in re.finditer(r"^##\s+.*$", source, re.M):
            current[1].append(source[pos : m.start()])
            current = (m.group(0).strip(), [], [])
            sections.append(current)
            pos = m.start()
        current[1].append(source[pos:])
    everything = "\n".join(o for _, _, outs in sections for o in outs)
    found = []
    for heading, prose, outputs in sections:
        shown = everything if WHOLE_NOTEBOOK_SECTIONS.match(heading) else "\n".join(outputs)
        for block in prose:
            for paragraph in re.split(r"\n\s*\n", block):
                if NOT_A_RESULT in paragraph or CITATION.search(paragraph) or paragraph.lstrip().startswith("#"):
                    continue
                text = _plain(paragraph)
                for m in RESULT_NUMBER.finditer(text):
                    if NAME_BEFORE.search(text[max(0, m.start() - 20) : m.start()]):
                        continue
                    unit = re.match(r"\s?([KkMBG])\b", text[m.end() : m.end() + 3])
                    if not _shown(m.group(0), shown, unit.group(1) if unit else ""):
                        context = text[max(0, m.start() - 60) : m.end() + 30].replace("\n", " ")
                        found.append((heading, m.group(0), context))
    return found


if __name__ == "__main__":
    main()
