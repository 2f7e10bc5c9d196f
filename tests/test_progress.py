"""mha_course.kit.progress: a bar that an executed notebook stores as its final text, a widget live."""

from __future__ import annotations

import json

import nbformat
import pytest
from tqdm.std import tqdm as text_tqdm

from mha_course.kit import progress


def test_outside_a_notebook_it_is_tqdms_text_bar(capsys):
    with progress.progress_bar(total=3, desc="steps") as bar:
        bar.update(3)
    assert isinstance(bar, text_tqdm)
    assert progress.final_text(bar) == "steps: 100%|██████████| 3/3"


def test_final_text_shows_the_count_reached_and_no_timing():
    bar = text_tqdm(total=8, desc="partial", disable=False, file=open("/dev/null", "w"))  # noqa: SIM115
    bar.update(2)
    assert progress.final_text(bar) == "partial:  25%|██▌       | 2/8"
    bar.close()


@pytest.mark.slow
def test_an_executed_notebook_stores_the_finished_bar_and_keeps_the_widget(tmp_path):
    from authoring.notebooks import notebook_client

    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(
            "from mha_course.kit.progress import progress_bar\n"
            "with progress_bar(total=5, desc='steps') as bar:\n"
            "    for _ in range(5):\n"
            "        bar.update(1)"
        ),
        nbformat.v4.new_code_cell("for _ in progress_bar(range(7), desc='iterating'):\n    pass"),
        nbformat.v4.new_code_cell("b = progress_bar(total=4, desc='stopped')\nb.update(1)\nb.close()"),
        nbformat.v4.new_code_cell("b = progress_bar(total=4, desc='hidden', leave=False)\nb.update(4)\nb.close()"),
    ]
    notebook_client(nb, tmp_path, timeout=120).execute()
    outputs = [cell.outputs for cell in nb.cells]
    texts = [[o["data"]["text/plain"] for o in outs if "data" in o] for outs in outputs]
    assert texts[:3] == [
        ["steps: 100%|██████████| 5/5"],
        ["iterating: 100%|██████████| 7/7"],
        ["stopped:  25%|██▌       | 1/4"],
    ]
    assert "%|" in texts[3][0] and "0/4" in texts[3][0], "leave=False: the bar closes as tqdm closes it"
    state = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    for outs in outputs[:3]:  # live, it is still the widget: its view names a progress bar's model
        view = outs[0]["data"]["application/vnd.jupyter.widget-view+json"]
        children = json.dumps(state[view["model_id"]]["state"])
        assert state[view["model_id"]]["model_name"] == "HBoxModel" and "IPY_MODEL_" in children
    models = {m["model_name"] for m in state.values()}
    assert "FloatProgressModel" in models
