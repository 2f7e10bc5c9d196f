"""Maintenance of the course notebooks: Colab badges and setup cells, deterministic execution.

    python -m authoring sync [NOTEBOOK ...]      write badges and setup cells (and README's course map)
    python -m authoring execute [NOTEBOOK ...]   re-execute in place, as the tests run them
    python -m authoring student-edition OUT_DIR  the student edition (see authoring/student_edition.py)

The repository the Colab links point to is read from one place: ``[project.urls] Repository``
in ``pyproject.toml``.
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
BADGE_RE = re.compile(r"\[!\[Open In Colab\]\([^)]*\)\]\([^)]*\)")
SETUP_TAG = "setup"
#: environment every notebook execution uses (the tests set the same in conftest.py)
EXEC_ENV = {"PYTHONHASHSEED": "0"}


def repository() -> tuple[str, str]:
    """(OWNER, REPO) from pyproject's ``[project.urls] Repository``."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    m = re.search(r'^Repository\s*=\s*"https://github\.com/([^/"]+)/([^/"]+?)(?:\.git)?/?"', text, re.M)
    if not m:
        raise ValueError('pyproject.toml has no [project.urls] Repository = "https://github.com/OWNER/REPO"')
    return m.group(1), m.group(2)


def colab_url(path: Path) -> str:
    return colab_url_for(Path(path).resolve().relative_to(ROOT).as_posix())


def colab_url_for(rel: str) -> str:
    """The Colab URL of the notebook at ``rel`` (a path relative to the repository root)."""
    owner, repo = repository()
    return f"https://colab.research.google.com/github/{owner}/{repo}/blob/main/{rel}"


def badge(path: Path) -> str:
    return badge_for(Path(path).resolve().relative_to(ROOT).as_posix())


def badge_for(rel: str) -> str:
    """The "Open in Colab" badge (Markdown) of the notebook at repo-relative path ``rel``."""
    return f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]({colab_url_for(rel)})"


def language_of(path: Path) -> str | None:
    """The language of the notebook at ``path``: "zh" under notebooks/zh/ (and the student
    edition's notebooks/student/zh/), else None (English, the source)."""
    return "zh" if Path(path).resolve().parent.name == "zh" else None


def setup_source(language: str | None = None) -> str:
    """The setup cell; ``language="zh"``: the Chinese notebooks' (the course speaking Chinese)."""
    owner, repo = repository()
    return (
        "# Setup: on Colab, install the course package (torch and ipywidgets are already there);\n"
        "# everywhere, import it and fix the seeds so every number below is reproducible.\n"
        "import subprocess\n"
        "import sys\n"
        "\n"
        'if "google.colab" in sys.modules:\n'
        "    subprocess.check_call(\n"
        f'        [sys.executable, "-m", "pip", "install", "-q", "mha-course @ git+https://github.com/{owner}/{repo}"]\n'
        "    )\n"
        "\n"
        "import mha_course as mc\n"
        "\n" + (f'mc.setup(language="{language}")' if language else "mc.setup()")
    )


def _source(cell) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def sync(path: Path) -> bool:
    """Write the badge into the first markdown cell and the setup cell (tag ``setup``, the first
    code cell). Returns True when the file changed."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    changed = False
    first_md = next((c for c in nb.cells if c.cell_type == "markdown"), None)
    if first_md is None:
        raise ValueError(f"{path}: needs a markdown title cell first")
    src = _source(first_md)
    new = BADGE_RE.sub(badge(path), src) if BADGE_RE.search(src) else src.rstrip() + "\n\n" + badge(path)
    if new != src:
        first_md.source, changed = new, True
    setup = next((c for c in nb.cells if SETUP_TAG in c.get("metadata", {}).get("tags", [])), None)
    if setup is None:
        setup = nbformat.v4.new_code_cell(setup_source(), metadata={"tags": [SETUP_TAG]})
        nb.cells.insert(nb.cells.index(first_md) + 1, setup)
        changed = True
    elif _source(setup) != setup_source(language_of(path)):
        setup.source, changed = setup_source(language_of(path)), True
    if changed:
        nbformat.write(nb, path)
    return changed


#: the longest a notebook client waits on a kernel socket before it looks at the socket itself
POLL_SLICE_S = 1.0


@functools.cache
def _sliced_kernel_manager():
    """nbclient's kernel manager, whose client's channels wait for a message in slices of
    POLL_SLICE_S. A wait on pyzmq's asyncio socket can miss the wake-up for a message that has
    already arrived (seen here: a cell that had finished, whose execute_reply nbclient saw only
    when the cell's timeout ran out, five minutes later); each slice ends with a real look at
    the socket, so such a message waits a second at most."""
    import time
    from queue import Empty

    from jupyter_client.asynchronous import AsyncKernelClient
    from jupyter_client.channels import AsyncZMQSocketChannel
    from jupyter_client.manager import AsyncKernelManager
    from traitlets import Type, default

    class SlicedChannel(AsyncZMQSocketChannel):
        async def get_msg(self, timeout=None):
            deadline = None if timeout is None else time.monotonic() + timeout
            while True:
                left = POLL_SLICE_S if deadline is None else max(0.0, deadline - time.monotonic())
                try:
                    return await super().get_msg(timeout=min(POLL_SLICE_S, left))
                except Empty:
                    if deadline is not None and deadline - time.monotonic() < 1e-3:  # a poll's resolution
                        raise

    class SlicedClient(AsyncKernelClient):
        shell_channel_class = Type(SlicedChannel)
        iopub_channel_class = Type(SlicedChannel)
        stdin_channel_class = Type(SlicedChannel)
        control_channel_class = Type(SlicedChannel)

    class SlicedKernelManager(AsyncKernelManager):
        @default("client_factory")
        def _client_factory_default(self):
            return SlicedClient

    return SlicedKernelManager


def notebook_client(nb, folder: Path | str, *, timeout: int):
    """An nbclient NotebookClient that executes ``nb`` in a fresh ``python3`` kernel started in
    ``folder``, with a timeout per cell (see :func:`_sliced_kernel_manager`)."""
    from nbclient import NotebookClient

    return NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        kernel_manager_class=_sliced_kernel_manager(),
        resources={"metadata": {"path": str(folder)}},
    )


def execute(path: Path, *, timeout: int = 600) -> None:
    """Execute a notebook top to bottom in a fresh kernel, in place, under EXEC_ENV."""
    import nbformat

    os.environ.update(EXEC_ENV)
    nb = nbformat.read(path, as_version=4)
    notebook_client(nb, Path(path).parent, timeout=timeout).execute()
    for cell in nb.cells:  # keep metadata free of run-dependent data (dates, timings)
        cell.get("metadata", {}).pop("execution", None)
    nbformat.write(nb, path)


def numbered_notebooks() -> list[Path]:
    return sorted(p for p in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("sync", "execute"):
        print(__doc__)
        return 2
    paths = [Path(p) for p in argv[1:]] or numbered_notebooks()
    for p in paths:
        if argv[0] == "sync":
            print(f"{p}: {'updated' if sync(p) else 'up to date'}")
        else:
            sync(p)
            execute(p)
            print(f"{p}: executed")
    if argv[0] == "sync" and len(argv) == 1:
        print(f"README.md: {'updated' if sync_readme() else 'up to date'}")
    return 0


def replace_block(text: str, name: str, body: str) -> str:
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    if start not in text or end not in text:
        raise ValueError(f"README.md lacks the markers {start} … {end}")
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{start}\n{body}\n{end}{tail}"


def readme_text() -> str:
    """README.md with its generated blocks (course map, glossary) brought up to date."""
    from mha_course.kit.course_map import course_map_markdown, glossary_markdown

    owner, repo = repository()
    existing = {p.stem for p in numbered_notebooks()}
    student = {p.stem for p in (NOTEBOOKS / "student").glob("[0-9][0-9]_*.ipynb")}  # the student edition
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    base = f"https://colab.research.google.com/github/{owner}/{repo}/blob/main/"
    course_map = course_map_markdown(colab_base=base, existing=existing, student=student, folder="notebooks/")
    text = replace_block(text, "course-map", course_map)
    return replace_block(text, "glossary", glossary_markdown())


def readme_zh_text() -> str:
    """README.zh-CN.md with its generated blocks (the Chinese course map, the glossary) brought up
    to date: the map's titles and lines from the catalogues, its links to notebooks/zh/."""
    from mha_course import i18n
    from mha_course.kit.course_map import course_map_markdown, glossary_markdown

    owner, repo = repository()
    zh = NOTEBOOKS / "zh"
    existing = {p.stem for p in zh.glob("[0-9][0-9]_*.ipynb")}
    student = {p.stem for p in (NOTEBOOKS / "student" / "zh").glob("[0-9][0-9]_*.ipynb")}
    text = (ROOT / "README.zh-CN.md").read_text(encoding="utf-8")
    base = f"https://colab.research.google.com/github/{owner}/{repo}/blob/main/"
    before = i18n.language()
    i18n.set_language("zh")
    try:
        course_map = course_map_markdown(colab_base=base, existing=existing, student=student, folder="notebooks/zh/")
        course_map = (
            course_map.replace(f"{base}notebooks/", f"{base}notebooks/zh/")
            .replace(f"{base}notebooks/zh/student/", f"{base}notebooks/student/zh/")
            .replace("(notebooks/zh/student/", "(notebooks/student/zh/")
            .replace("[student](", "[学生版](")
        )
        glossary = glossary_markdown()
    finally:
        i18n.set_language(before)
    text = replace_block(text, "course-map", course_map)
    return replace_block(text, "glossary", glossary)


def sync_readme() -> bool:
    changed = False
    for path, text in ((ROOT / "README.md", readme_text), (ROOT / "README.zh-CN.md", readme_zh_text)):
        if not path.exists():
            continue
        new = text()
        if new != path.read_text(encoding="utf-8"):
            path.write_text(new, encoding="utf-8")
            changed = True
    return changed
