"""What a run of a student notebook must show, whichever way it ran: in nbclient's kernel
(tests/test_student_edition.py) or in JupyterLab in a browser, saved from the page
(tests/browser/test_jupyterlab.py) — one execution of a notebook feeds every check.

:func:`problems` compares the executed notebook with the stored student notebook: no error;
every exercise check says "not attempted" (未尝试 in the Chinese edition) and shows no ✅/❌; every
cell the build left unchanged prints what it printed in the solution notebook (the outputs strict
nbval compares, sanitised the same way), so nothing after an exercise depends on the learner's
function.
"""

from __future__ import annotations

import configparser
import functools
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: outputs that strict nbval does not compare either (pictures, a widget's model id)
SKIPPED_MIMES = ("image/png", "image/jpeg", "application/vnd.jupyter.widget-view+json")
#: a call of one of the course's checkers
CHECK_CALL = re.compile(r"\bmc\.check\.\w+\(")


def source(cell) -> str:
    s = cell.get("source", "")
    return "".join(s) if isinstance(s, list) else s


def output_texts(cell) -> list[str]:
    """Every text a cell's outputs show (streams, text and JSON data, tracebacks)."""
    texts = []
    for out in cell.get("outputs", []):
        if "text" in out:
            texts.append(source({"source": out["text"]}))
        for mime, value in out.get("data", {}).items():
            if mime.startswith("text/") or mime.endswith("json"):
                texts.append(value if isinstance(value, str) else json.dumps(value))
        if out.get("output_type") == "error":
            texts.append("\n".join(out.get("traceback", [])))
    return texts


@functools.lru_cache(maxsize=1)
def sanitizers() -> tuple:
    cfg = configparser.ConfigParser(interpolation=None)  # nbval reads it raw: a regex may hold %
    cfg.read(ROOT / "tests" / "sanitize.cfg", encoding="utf-8")
    return tuple((re.compile(cfg[s]["regex"]), cfg[s]["replace"]) for s in cfg.sections())


def comparable(cell) -> list[str]:
    """The outputs strict nbval compares (consecutive stream chunks joined), sanitised the same way."""
    values: list[str] = []
    for out in cell.get("outputs", []):
        if "text" in out:
            text = f"{out.get('name')}: {source({'source': out['text']})}"
            if values and values[-1].startswith(f"{out.get('name')}: "):
                text = values.pop() + text.split(": ", 1)[1]
            values.append(text)
        for mime, value in sorted(out.get("data", {}).items()):
            if mime not in SKIPPED_MIMES:
                values.append(f"{mime}: {value if isinstance(value, str) else json.dumps(value, sort_keys=True)}")
    for pattern, replacement in sanitizers():
        values = [pattern.sub(replacement, v) for v in values]
    return values


def problems(stored, executed, *, chinese: bool) -> list[str]:
    """What is wrong with ``executed`` (a run of the student notebook ``stored``, cell for cell)."""
    if len(stored.cells) != len(executed.cells):
        return [f"the run has {len(executed.cells)} cells, the student notebook {len(stored.cells)}"]
    found = []
    for index, (before, after) in enumerate(zip(stored.cells, executed.cells, strict=True)):
        if after.cell_type != "code":
            continue
        errors = [o for o in after.get("outputs", []) if o.get("output_type") == "error"]
        if errors:
            found.append(f"cell {index} raised {errors[0]['ename']}: {errors[0]['evalue']}")
            continue
        if before.get("execution_count") is None and after.get("metadata", {}).get("nbgrader", {}).get("grade"):
            shown = "\n".join(output_texts(after))  # an exercise's check cell
            word = "未尝试" if chinese else "not attempted"
            if word not in shown or "✅" in shown or "❌" in shown:
                found.append(f"cell {index}: the check should say {word!r} (and no ✅/❌), got {shown!r}")
        elif before.get("execution_count") is not None and "nbval-ignore-output" not in before.get("metadata", {}).get(
            "tags", []
        ):
            shown = "\n".join(output_texts(after))
            if CHECK_CALL.search(source(after)) and ("not attempted" in shown or "未尝试" in shown):
                continue  # another check of the learner's function (e.g. a stricter stretch check)
            if comparable(after) != comparable(before):
                found.append(
                    f"cell {index} prints something else than the solved notebook stored: does it use the "
                    f"learner's function (use the package's reference after an exercise), or is the solved "
                    f"notebook stale (re-execute it, then rebuild the student edition)?\n{source(after)[:200]}\n"
                    f"stored: {comparable(before)!r}\nnow:    {comparable(after)!r}"
                )
    return found
