"""The one pattern every interactive explorer follows (ipywidgets 7 and 8 alike):

1. draw the figure for the default values and display it as a static image — what GitHub,
   nbviewer, nbval and a printed page see;
2. then display the controls and an ``Output`` that is redrawn only inside an ``observe``
   callback, so that nothing is stored in the notebook's outputs for the widget.

The drawing is a plain function ``draw(**values) -> Figure`` that tests call directly.
"""

from __future__ import annotations

import math

import matplotlib.pyplot as plt


def _same_values(now: dict, before: dict) -> bool:
    """Equal, floats up to the last bits (a slider's front end may send back a value it has
    rounded differently, e.g. 1.0000000000000009 for 1.0, when it is first shown)."""
    for name, value in now.items():
        old = before.get(name)
        if isinstance(value, float) and isinstance(old, (int, float)) and not isinstance(old, bool):
            if not math.isclose(value, old, rel_tol=1e-9, abs_tol=1e-12):
                return False
        elif value != old:
            return False
    return now.keys() == before.keys()


def explorer(draw, controls: dict, *, show_static: bool = True):
    """Show ``draw(**defaults)`` statically, then ``controls`` (name -> widget) that redraw it.

    Returns the ``VBox`` that holds the controls and the live output (for tests to drive).
    """
    import ipywidgets as W
    from IPython.display import clear_output, display

    def values():
        return {name: w.value for name, w in controls.items()}

    drawn = values()  # what the figure on show was drawn with
    if show_static:
        fig = draw(**drawn)
        display(fig)
        plt.close(fig)
    out = W.Output()

    def redraw(change=None):
        nonlocal drawn
        if change is not None and _same_values(values(), drawn):
            return  # a front end's rounding of a float (1.0 -> 1.0000000000000009): nothing new to draw
        drawn = values()
        with out:
            clear_output(wait=True)
            fig = draw(**drawn)
            display(fig)
            plt.close(fig)

    for w in controls.values():
        w.observe(redraw, names="value")
    box = W.VBox([W.HBox(list(controls.values())), out])
    box.redraw = redraw  # lets a test (or a learner) force an update
    display(box)
    return box
