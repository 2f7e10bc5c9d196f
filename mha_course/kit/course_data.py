"""The course's data files (quizzes, hint ladders, predictions): one JSON file per notebook in a
folder of ``mha_course/kit``, read and validated the same way, and shown in the course's language (mha_course.i18n)."""

from __future__ import annotations

import json
from collections.abc import Callable
from importlib import resources


def read(folder: str, notebook: str, validate: Callable[[dict], list[str]], *, missing_ok: bool = False) -> dict:
    """The validated JSON of notebook ``notebook`` ("05" or "05_masks...") in ``kit/<folder>/``.

    A missing file is ``{}`` when ``missing_ok``, else a ValueError naming the path; an invalid
    one is a ValueError listing the problems ``validate`` found."""
    key = notebook.split("_")[0]
    path = f"mha_course/kit/{folder}/{key}.json"
    try:
        text = resources.files(f"mha_course.kit.{folder}").joinpath(f"{key}.json").read_text(encoding="utf-8")
    except FileNotFoundError:
        if missing_ok:
            return {}
        raise ValueError(f"nothing for notebook {notebook!r} in {folder} (looked for {path})") from None
    data = json.loads(text)
    problems = validate(data)
    if problems:
        raise ValueError(f"{path} is invalid: " + "; ".join(problems))
    from .. import i18n

    return i18n.translate_data(folder, key, data)  # in the course's language (English: as read)
