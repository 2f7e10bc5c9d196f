"""Drive every explorer of a notebook inside the kernel that executes it (the student edition's
run, tests/test_student_edition.py): no second execution of the notebook is needed.

Before the notebook's first cell, SPY (:func:`spy_cell`) wraps ``mha_course.kit.widgets.explorer``
so that each explorer records its controls and every drawing (the values it was drawn with, whether
they were the controls' current values, and the figure as a small PNG), and records every warning
about widget arguments (ipywidgets 7 takes an argument it does not know, e.g. one new in 8, with
only a warning) and every other warning from ipywidgets or traitlets a learner would see, without
showing it: the notebook's own outputs stay what they are. After the last cell, DRIVE changes every
control of every explorer the way the front end does (a state update) and prints a JSON report,
which :func:`problems` reads: each change must redraw once, with the current values of all the
controls, and change the figure; no callback may raise; no widget warning.

In JupyterLab (tests/browser/test_jupyterlab.py) the browser changes the controls instead; the spy
then writes what it saw to a file, which :func:`browser_problems` reads (the browser itself sees
each figure change).
"""

from __future__ import annotations

import json
from pathlib import Path

import nbformat

SPY = r"""
def _mha_spy(record_file=None):
    import io
    import json
    import warnings
    from pathlib import Path

    import mha_course.kit.widgets as mw

    explorers, widget_warnings = [], []
    real_explorer, real_show = mw.explorer, warnings.showwarning

    def dump():  # what a browser's test reads back, after each drawing
        if record_file is not None:
            Path(record_file).write_text(json.dumps({
                "explorers": [
                    {
                        "controls": list(r["controls"]),
                        "errors": r["errors"],
                        "draws": len(r["calls"]),
                        "drawn_with": [values for values, _ in r["calls"]],
                        "stale_draws": r["stale"],
                    }
                    for r in explorers
                ],
                "widget_warnings": sorted(set(widget_warnings)),
            }, default=repr))

    def spy(draw, controls, **kwargs):
        record = {"calls": [], "errors": [], "controls": controls, "stale": 0}

        def draw_and_record(**values):
            if values != {n: w.value for n, w in controls.items()}:
                record["stale"] += 1  # drawn with values the controls no longer have
            try:
                fig = draw(**values)
            except Exception as e:
                record["errors"].append(f"{type(e).__name__}: {e}")
                dump()
                raise
            png = io.BytesIO()
            if record_file is None:  # the kernel's driver compares the figures; a browser sees them
                fig.savefig(png, format="png", dpi=30)
            record["calls"].append((dict(values), png.getvalue()))
            dump()
            return fig

        box = real_explorer(draw_and_record, controls, **kwargs)
        explorers.append(record)
        dump()
        return box

    def show(message, category, filename, lineno, file=None, line=None):
        if "unrecognized arguments" in str(message) or {"ipywidgets", "traitlets"} & set(Path(filename).parts):
            widget_warnings.append(f"{category.__name__}: {message}")
            dump()
        else:
            real_show(message, category, filename, lineno, file, line)

    mw.explorer = spy
    warnings.showwarning = show
    # shown each time (a DeprecationWarning is otherwise hidden outside __main__); the others keep
    # the filters a learner's kernel has, so only what a learner would see is recorded
    warnings.filterwarnings("always", message=".*unrecognized arguments")
    return explorers, widget_warnings


_mha_explorers, _mha_widget_warnings = _mha_spy(RECORD_FILE)
del _mha_spy
"""

DRIVE = r"""
def _mha_drive(explorers, widget_warnings):
    import json

    import ipywidgets as W

    def next_state(widget):  # the state update the front end sends when a learner changes it
        if isinstance(widget, W.FloatLogSlider):  # its steps are steps of the exponent
            up = widget.value * widget.base**widget.step
            return {"value": up if up <= widget.base**widget.max else widget.value / widget.base**widget.step}
        if isinstance(widget, (W.IntSlider, W.FloatSlider)):
            up = widget.value + widget.step
            return {"value": up if up <= widget.max else widget.value - widget.step}
        if isinstance(widget, (W.Checkbox, W.ToggleButton)):
            return {"value": not widget.value}
        if isinstance(widget, (W.Dropdown, W.ToggleButtons, W.RadioButtons, W.Select)):
            return {"index": (widget.index + 1) % len(widget.options)}
        raise TypeError(f"no known way to change a {type(widget).__name__}")

    report = []
    for record in explorers:
        controls, steps = record["controls"], []
        for name, widget in controls.items():
            before = len(record["calls"])
            previous = record["calls"][-1][1] if record["calls"] else b""
            try:
                state = next_state(widget)
                widget.set_state(state)
            except Exception as e:
                steps.append({"control": name, "problem": f"{type(e).__name__}: {e}"})
                continue
            new_calls = record["calls"][before:]
            current = {n: w.value for n, w in controls.items()}
            steps.append({
                "control": name,
                "state": repr(state),
                "redraws": len(new_calls),
                "drawn_with_current_values": bool(new_calls) and new_calls[-1][0] == current,
                "figure_changed": bool(new_calls) and new_calls[-1][1] != previous,
            })
        report.append({"controls": list(controls), "errors": record["errors"], "steps": steps})
    return json.dumps({"explorers": report, "widget_warnings": sorted(set(widget_warnings))})


print("EXPLORER-REPORT " + _mha_drive(_mha_explorers, _mha_widget_warnings))
"""

MARK = "EXPLORER-REPORT "


def spy_cell(record_file=None) -> str:
    """SPY's source; with ``record_file`` (a path) it also writes what it saw there after every
    drawing, for a test whose notebook runs in a browser (it reads the file with :func:`recorded`)."""
    return SPY.replace("RECORD_FILE", "None" if record_file is None else repr(str(record_file)))


def recorded(record_file) -> dict:
    """What the spy of :func:`spy_cell` has written (nothing yet: no explorer was created)."""
    try:
        return json.loads(Path(record_file).read_text())
    except FileNotFoundError:
        return {"explorers": [], "widget_warnings": []}


def browser_problems(record: dict, where: str, changes: list[int]) -> list[str]:
    """What is wrong with explorers a browser has driven, one change of each control
    (``changes[k]``: the changes made to explorer k): each change redrew once, every drawing used
    the controls' current values, no callback raised, no widget warning."""
    found = [f"{where}: {w}" for w in record["widget_warnings"]]
    if len(record["explorers"]) != len(changes):
        found.append(f"{where}: {len(record['explorers'])} explorers were created, the page shows {len(changes)}")
    for k, (explorer, made) in enumerate(zip(record["explorers"], changes, strict=False), 1):
        if explorer["errors"]:
            found.append(f"{where}, explorer {k} raised while drawing: {explorer['errors']}")
        if explorer["draws"] != 1 + made:
            found.append(
                f"{where}, explorer {k}: {explorer['draws']} drawings for its first and {made} changes, "
                f"with {explorer['drawn_with']}"
            )
        if explorer["stale_draws"]:
            found.append(f"{where}, explorer {k}: {explorer['stale_draws']} drawing(s) with stale values")
    return found


def has_explorer(nb) -> bool:
    return any(c.cell_type == "code" and "explorer(" in c.source for c in nb.cells)


def execute(nb, folder, *, drive: bool, timeout: int = 300):
    """Execute ``nb`` (in place) in a fresh kernel started in ``folder``; with ``drive``, SPY runs
    before the first cell and DRIVE after the last, and both are removed again. Returns the
    report (a dict) with ``drive``, else None."""
    from authoring.notebooks import notebook_client

    if drive:
        nb.cells.insert(0, nbformat.v4.new_code_cell(spy_cell()))
        nb.cells.append(nbformat.v4.new_code_cell(DRIVE))
    try:
        notebook_client(nb, folder, timeout=timeout).execute()
    finally:
        if drive:
            spy, driver = nb.cells.pop(0), nb.cells.pop()
    if not drive:
        return None
    for name, cell in (("the explorers' spy", spy), ("the explorers' driver", driver)):
        errors = [o for o in cell.outputs if o.output_type == "error"]
        assert not errors, f"{name} raised {errors[0].ename}: {errors[0].evalue}"
    text = "".join(o.get("text", "") for o in driver.outputs if o.output_type == "stream")
    (line,) = [line for line in text.splitlines() if line.startswith(MARK)]
    return json.loads(line[len(MARK) :])


def problems(report: dict, where: str, version: str) -> list[str]:
    """What is wrong with the explorers of one notebook (empty: each redraws once, with the current
    values, to a new figure, on every control; no callback raised; no widget warning)."""
    found = [f"{where} (ipywidgets {version}): {w}" for w in report["widget_warnings"]]
    if not report["explorers"]:
        found.append(f"{where}: no explorer was created")
    for k, explorer in enumerate(report["explorers"], 1):
        if explorer["errors"]:
            found.append(f"{where}, explorer {k} raised while drawing: {explorer['errors']}")
        if not len(explorer["steps"]) == len(explorer["controls"]) >= 1:
            found.append(f"{where}, explorer {k}: {len(explorer['steps'])} steps for controls {explorer['controls']}")
        for step in explorer["steps"]:
            at = f"{where}, explorer {k}, control {step['control']!r} (ipywidgets {version})"
            if "problem" in step:
                found.append(f"{at}: {step['problem']}")
            elif step["redraws"] != 1:
                found.append(f"{at}: {step['redraws']} redraws for one change {step['state']}")
            elif not step["drawn_with_current_values"]:
                found.append(f"{at}: redrawn with stale values")
            elif not step["figure_changed"]:
                found.append(f"{at}: the figure did not change after {step['state']}")
    return found
