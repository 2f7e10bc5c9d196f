"""The course as a learner meets it: the student edition (what the hub links hand out) in
JupyterLab in a real (headless) Chromium.

For notebooks 01, 02 and 05 and every notebook with an explorer or a quiz (cells calling
``explorer(``, ``.widgets.`` or ``quiz.show``), each test opens a copy of the student notebook in
JupyterLab, clears its outputs (Edit menu), runs it (Run > Run All Cells) and checks:

* every code cell ran once, top to bottom, in a fresh kernel (prompts [1] … [N]);
* no cell shows an error, a traceback or a warning, and no widget failed to render;
* saved from the page (File > Save Notebook), the run passes the student edition's checks
  (tests/student_run.py: every exercise check says "not attempted", every other cell prints what
  the solved notebook stored), so the same notebook is not executed a second time for them (see
  ``pytest_collection_modifyitems`` in tests/browser/conftest.py);
* each explorer shows its static figure and renders all its controls; changing each control
  (arrow key on a slider, another option of a dropdown or toggle buttons, a click on a checkbox)
  draws a new figure into the explorer (the image data changes every time), and the kernel drew
  it once per change, with the controls' current values, without an error or a widget warning
  (the explorers' spy of tests/explorer_driver.py, inserted as the copy's first cell);
* the quiz renders one set of radio buttons per question, and picking each option of the first
  question shows the feedback its JSON defines (✅ for the correct option, ❌ for the others).

Screenshots go to tests/browser/screenshots/ (git-ignored): the notebook after the run, each
explorer after its last change, and the quiz.
"""

from __future__ import annotations

import ast
import copy
import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import explorer_driver
import nbformat
import pytest
import student_run

from authoring import notebooks as notebook_tools
from mha_course.kit import quiz

pytestmark = pytest.mark.browser

ALWAYS = ("01", "02", "05")  # opened whether or not they have widgets
WIDGET_CALL = re.compile(r"explorer\(|\.widgets\.|quiz\.show\(")
RUN_TIMEOUT_MS = 300_000  # one notebook, Run All, on a loaded 2-core machine
STEP_TIMEOUT_MS = 60_000  # one redraw or one page load

# the DOM class each ipywidgets control renders with (ipywidgets 8 in JupyterLab 4)
CONTROL_CLASSES = ("widget-slider", "widget-dropdown", "widget-toggle-buttons", "widget-checkbox", "widget-radio")


@dataclass
class Explorer:
    cell: int  # index among all cells
    num_controls: int | None  # keys of the cell's `controls = {...}` literal, when it has one


@dataclass
class Notebook:
    path: Path
    num_cells: int
    num_code: int  # non-empty code cells
    explorers: list[Explorer] = field(default_factory=list)
    quiz_cell: int | None = None
    quiz_key: str | None = None

    def after_a_first_cell(self) -> Notebook:
        """The same notebook with one more code cell before its first."""
        return Notebook(
            self.path,
            self.num_cells + 1,
            self.num_code + 1,
            [Explorer(e.cell + 1, e.num_controls) for e in self.explorers],
            None if self.quiz_cell is None else self.quiz_cell + 1,
            self.quiz_key,
        )


def _num_controls(source: str) -> int | None:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict):
            if any(isinstance(t, ast.Name) and t.id == "controls" for t in node.targets):
                return len(node.value.keys)
    return None


def read_notebook(path: Path) -> Notebook:
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    info = Notebook(path, len(cells), 0)
    for i, cell in enumerate(cells):
        source = "".join(cell["source"])
        if cell["cell_type"] != "code" or not source.strip():
            continue
        info.num_code += 1
        if "explorer(" in source:
            info.explorers.append(Explorer(i, _num_controls(source)))
        if m := re.search(r"quiz\.show\(\s*[\"'](\w+)[\"']", source):
            info.quiz_cell, info.quiz_key = i, m.group(1)
    return info


def selected_notebooks() -> list[Path]:
    chosen = []
    for path in notebook_tools.numbered_notebooks():
        sources = ["".join(c["source"]) for c in json.loads(path.read_text(encoding="utf-8"))["cells"]]
        if path.name[:2] in ALWAYS or any(WIDGET_CALL.search(s) for s in sources):
            chosen.append(path)
    return chosen


NOTEBOOKS = selected_notebooks()


# --- what the page shows -------------------------------------------------------------------------

PROMPTS_JS = (
    "() => [...document.querySelectorAll('.jp-Notebook .jp-CodeCell .jp-InputPrompt')].map(e => e.textContent.trim())"
)

# Run All is over when no cell is queued or running and either every code cell has a number or
# a cell failed (JupyterLab then stops running the rest).
RUN_DONE_JS = r"""(n) => {
  const prompts = [...document.querySelectorAll('.jp-Notebook .jp-CodeCell .jp-InputPrompt')]
    .map(e => e.textContent.trim());
  if (prompts.some(t => t === '[*]:')) return false;
  const numbered = prompts.filter(t => /^\[\d+\]:$/.test(t)).length;
  const failed = [...document.querySelectorAll('.jp-Notebook .jp-OutputArea-output')]
    .some(e => /Traceback|Error/.test(e.textContent) && e.dataset.mimeType === 'application/vnd.jupyter.stderr');
  return numbered === n || failed;
}"""

PROBLEM = re.compile(r"Traceback|Error|Warning|warn\(")


OUTPUT_TEXTS_JS = """() => [...document.querySelectorAll('.jp-Notebook .jp-OutputArea-output')].map(
  e => [e.dataset.mimeType === 'application/vnd.jupyter.stderr', e.innerText])"""


def problems_on_page(page) -> list[str]:
    """Text of every output that shows an error, a traceback, a warning or a broken widget
    (read in one call to the page)."""
    found = []
    for stderr, text in page.evaluate(OUTPUT_TEXTS_JS):
        if stderr and PROBLEM.search(text):
            found.append("stderr/error output: " + text[-1500:])
        if "Error displaying widget" in text or "Error rendering output" in text:
            found.append("widget failed to render: " + text[:300])
    return found


def menu(page, top: str, item: str) -> None:
    page.get_by_role("menuitem", name=top, exact=True).click()
    page.get_by_role("menuitem", name=item, exact=True).click()


def change(control) -> str:
    """Change one ipywidgets control the way a learner would; returns what was done."""
    cls = control.get_attribute("class") or ""
    if "widget-slider" in cls:
        handle = control.locator(".noUi-handle")
        now, top = float(handle.get_attribute("aria-valuenow")), float(handle.get_attribute("aria-valuemax"))
        key = "ArrowLeft" if now >= top else "ArrowRight"
        handle.focus()
        handle.press(key)
        return f"slider {key}"
    if "widget-dropdown" in cls:
        select = control.locator("select")
        current = select.evaluate("s => s.selectedIndex")
        count = select.locator("option").count()
        select.select_option(index=(current + 1) % count)
        return f"dropdown option {(current + 1) % count}"
    if "widget-toggle-buttons" in cls:
        buttons = control.locator("button")
        for i in range(buttons.count()):
            if "mod-active" not in (buttons.nth(i).get_attribute("class") or ""):
                buttons.nth(i).click()
                return f"toggle button {i}"
    if "widget-checkbox" in cls:
        control.locator("input[type=checkbox]").click()
        return "checkbox"
    if "widget-radio" in cls:
        radios = control.locator("input[type=radio]")
        for i in range(radios.count()):
            if not radios.nth(i).is_checked():
                radios.nth(i).click()
                return f"radio {i}"
    raise AssertionError(f"no way to change a control with classes {cls!r}")


def save_and_read(page, path: Path, num_code: int):
    """File > Save Notebook, then the notebook as JupyterLab wrote it (every code cell executed)."""
    page.get_by_role("menuitem", name="File", exact=True).click()
    page.locator('.lm-Menu-item[data-command="docmanager:save"]').click()  # "Save Notebook Ctrl+S"
    deadline = time.monotonic() + STEP_TIMEOUT_MS / 1000
    while True:
        try:
            saved = nbformat.read(path, as_version=4)
            counts = [c.execution_count for c in saved.cells if c.cell_type == "code" and c.source.strip()]
            if len(counts) == num_code and None not in counts:
                return saved
        except (ValueError, OSError):  # caught in the middle of the write
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path.name} was not saved with its outputs")
        time.sleep(0.2)


# resolves to nothing: handing the notebook widget back to Python would make Playwright serialise
# JupyterLab's object graph, which took about 2.5 s per notebook
OPEN_JS = """async name => {
  await window.jupyterapp.commands.execute('docmanager:open', {path: name, factory: 'Notebook'});
}"""
# every document closed without asking to save (the copies are throwaway), then the kernels go by REST
CLOSE_ALL_JS = """() => {
  for (const widget of Array.from(window.jupyterapp.shell.widgets('main'))) {
    if (widget.context) widget.context.model.dirty = false;
    widget.dispose();
  }
}"""


class LabPage:
    """One browser page with JupyterLab loaded, for every notebook of the session: each test opens
    its notebook in the running app and closes it afterwards, instead of loading JupyterLab again
    (a page load costs about 6 s of Chromium's CPU). A test that fails discards the page, so the
    next one starts from a fresh load."""

    def __init__(self, browser, lab):
        self.browser, self.lab, self.page = browser, lab, None
        self.errors: list[str] = []  # uncaught errors in the page's scripts since the last open

    def open(self, name: str, nb: Notebook):
        """The page, with notebook ``name`` open (and nothing else) and its kernel idle."""
        if self.page is None or self.page.is_closed():
            self.page = self.browser.new_page(viewport={"width": 1400, "height": 1600})
            self.page.set_default_timeout(STEP_TIMEOUT_MS)
            self.page.on("pageerror", lambda e: self.errors.append(str(e)))
            self.page.goto(self.lab.url())
            self.page.wait_for_function("() => window.jupyterapp !== undefined")
            self.page.evaluate("() => window.jupyterapp.restored")
        self.errors.clear()
        self.page.evaluate(OPEN_JS, name)
        self.page.wait_for_function(
            "n => document.querySelectorAll('.jp-Notebook .jp-Cell').length === n", arg=nb.num_cells
        )
        self.lab.wait_for_kernel(name)
        return self.page

    def close_notebook(self) -> None:
        if self.page is not None and not self.page.is_closed():
            self.page.evaluate(CLOSE_ALL_JS)
        self.lab.shutdown_kernels()

    def discard(self) -> None:
        if self.page is not None:
            self.page.close()
        self.page = None
        self.lab.shutdown_kernels()


@pytest.fixture(scope="module")
def lab_page(browser, lab):
    shared = LabPage(browser, lab)
    yield shared
    shared.discard()


def open_and_run_all(lab_page: LabPage, name: str, nb: Notebook):
    """Open the notebook, clear its stored outputs (Edit menu), Run > Run All Cells, wait; the page."""
    from playwright.sync_api import expect

    expect.set_options(timeout=STEP_TIMEOUT_MS)  # widgets render slowly on a loaded 2-core machine
    page = lab_page.open(name, nb)
    menu(page, "Edit", "Clear Outputs of All Cells")
    page.wait_for_function(f"() => ({PROMPTS_JS})().every(t => t === '[ ]:')")
    menu(page, "Run", "Run All Cells")
    page.wait_for_function(RUN_DONE_JS, arg=nb.num_code, timeout=RUN_TIMEOUT_MS, polling=500)
    expect(page.get_by_text("Loading widget...")).to_have_count(0)
    return page


# --- the tests --------------------------------------------------------------------------------------


@pytest.mark.executes_notebooks
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_and_its_widgets_work(path, lab, lab_page, screenshots):
    from playwright.sync_api import expect

    served = lab.work / path.name  # the copy JupyterLab serves (authors may be editing the original)
    stored = nbformat.read(served, as_version=4)
    nb = read_notebook(served)
    spied = bool(nb.explorers)
    record_file = lab.work / f".{path.stem}-explorers.json"
    if spied:  # the explorers' spy first, as in the kernel-only run
        with_spy = copy.deepcopy(stored)
        with_spy.cells.insert(0, nbformat.v4.new_code_cell(explorer_driver.spy_cell(record_file)))
        nbformat.write(with_spy, served)
        nb = nb.after_a_first_cell()
    page = None
    try:
        page = open_and_run_all(lab_page, path.name, nb)
        page.screenshot(path=screenshots / f"{path.stem}.png")

        problems = problems_on_page(page)
        assert not problems, f"{path.name} shows problems in JupyterLab:\n" + "\n---\n".join(problems)
        prompts = [p for p in page.evaluate(PROMPTS_JS) if p != "[ ]:"]
        assert prompts == [f"[{i}]:" for i in range(1, nb.num_code + 1)], (
            f"not every code cell ran once, top to bottom: {prompts}"
        )

        executed = save_and_read(page, served, nb.num_code)
        if spied:
            spy = executed.cells.pop(0)
            assert not [o for o in spy.outputs if o.output_type == "error"], "the explorers' spy raised"
        found = student_run.problems(stored, executed, chinese=False)
        assert not found, f"{path.name}, run in JupyterLab:\n" + "\n".join(found)

        cells = page.locator(".jp-Notebook .jp-Cell")
        changes = []
        for k, explorer in enumerate(nb.explorers, 1):
            cell = cells.nth(explorer.cell)
            static = cell.locator('.jp-Cell-outputArea > .jp-OutputArea-child > [data-mime-type="image/png"] img')
            expect(static).to_have_count(1)  # the static figure comes first
            box = cell.locator(".widget-vbox").first
            controls = box.locator(":scope > .widget-hbox > *")
            expect(controls.first).to_be_visible()
            if explorer.num_controls is not None:
                expect(controls).to_have_count(explorer.num_controls)
            assert controls.count() >= 1, f"explorer {k} renders no controls"
            previous = static.get_attribute("src")
            live = box.locator(".widget-output img")
            for i in range(controls.count()):
                control = controls.nth(i)
                classes = control.get_attribute("class") or ""
                assert any(c in classes for c in CONTROL_CLASSES), f"explorer {k}: unexpected control {classes!r}"
                done = change(control)
                expect(live, f"explorer {k}, control {i} ({done}): no new figure").to_have_count(1)
                expect(live, f"explorer {k}, control {i} ({done}): the figure did not change").not_to_have_attribute(
                    "src", previous
                )
                previous = live.get_attribute("src")
            changes.append(controls.count())
            cell.screenshot(path=screenshots / f"{path.stem}-explorer{k}.png")
        if spied:
            found = explorer_driver.browser_problems(explorer_driver.recorded(record_file), path.name, changes)
            assert not found, "\n".join(found)

        if nb.quiz_cell is not None:
            questions = quiz.load(nb.quiz_key)["questions"]
            cell = cells.nth(nb.quiz_cell)
            radios = cell.locator(".widget-radio")
            expect(radios).to_have_count(len(questions))
            note = cell.locator(".widget-vbox > .widget-html").nth(1)  # Q1's feedback line
            expect(note).to_have_text("")
            for j, option in enumerate(questions[0]["options"]):
                radios.first.locator("input[type=radio]").nth(j).click()
                expect(note).to_contain_text("Correct." if option["correct"] else "Not quite.")
                expect(note).to_contain_text(option["explanation"][:40])
            cell.screenshot(path=screenshots / f"{path.stem}-quiz.png")

        problems = problems_on_page(page)  # a callback that raised shows its traceback in the explorer
        assert not problems, f"{path.name}: problems after using the widgets:\n" + "\n---\n".join(problems)
    except Exception:
        if page is not None:
            page.screenshot(path=screenshots / f"{path.stem}-FAILED.png")
        if lab_page.errors:
            print("uncaught page errors:", *lab_page.errors, sep="\n")
        print("JupyterLab log (tail):\n" + lab.log_tail(2000))
        lab_page.discard()
        raise
    lab_page.close_notebook()


BROKEN = [
    "import ipywidgets as W\nimport matplotlib.pyplot as plt\nimport mha_course as mc\n\n\n"
    "def draw(x):\n    if x > 3:\n        raise ValueError('boom in draw')\n"
    "    fig, ax = plt.subplots()\n    ax.plot([0, x])\n    return fig\n\n\n"
    "_ = mc.widgets.explorer(draw, {'x': W.IntSlider(value=3, min=0, max=5)})",
    "import warnings\n\nwarnings.warn('careful')",
    "1 / 0",
    "print('never runs')",
]


def test_the_checks_see_errors_warnings_and_failing_callbacks(lab, lab_page):
    """The harness is not blind: a notebook with a warning, an exception and an explorer whose
    callback raises shows each of them, and the cells after the exception stay unrun."""
    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3"}})
    nb.cells = [nbformat.v4.new_markdown_cell("# broken on purpose")] + [nbformat.v4.new_code_cell(c) for c in BROKEN]
    nbformat.write(nb, lab.work / "zz_broken.ipynb")
    try:
        page = open_and_run_all(lab_page, "zz_broken.ipynb", read_notebook(lab.work / "zz_broken.ipynb"))
        assert page.evaluate(PROMPTS_JS) == ["[1]:", "[2]:", "[3]:", "[ ]:"]
        found = "\n".join(problems_on_page(page))
        assert "UserWarning: careful" in found and "ZeroDivisionError" in found, found
        assert "boom in draw" not in found
        change(page.locator(".jp-Notebook .jp-Cell").nth(1).locator(".widget-hbox > *").first)  # x: 3 -> 4
        page.wait_for_function("() => document.querySelector('.widget-output').textContent.includes('boom in draw')")
        assert "ValueError: boom in draw" in "\n".join(problems_on_page(page))
    except Exception:
        lab_page.discard()
        raise
    lab_page.close_notebook()
