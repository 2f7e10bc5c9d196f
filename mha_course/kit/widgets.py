"""The one pattern every interactive explorer follows (ipywidgets 7 and 8 alike):

1. draw the figure for the default values and display it as a static image — what GitHub,
   nbviewer, nbval and a printed page see;
2. then display the controls and an ``Output`` that is redrawn only inside an ``observe``
   callback, so that nothing is stored in the notebook's outputs for the widget.

The drawing is a plain function ``draw(**values) -> Figure`` that tests call directly.
"""

from __future__ import annotations

import matplotlib.pyplot as plt


def explorer(draw, controls: dict, *, show_static: bool = True):
    """Show ``draw(**defaults)`` statically, then ``controls`` (name -> widget) that redraw it.

    Returns the ``VBox`` that holds the controls and the live output (for tests to drive).
    """
    import ipywidgets as W
    from IPython.display import clear_output, display

    def values():
        return {name: w.value for name, w in controls.items()}

    if show_static:
        fig = draw(**values())
        display(fig)
        plt.close(fig)
    out = W.Output()

    def redraw(change=None):
        with out:
            clear_output(wait=True)
            fig = draw(**values())
            display(fig)
            plt.close(fig)

    for w in controls.values():
        w.observe(redraw, names="value")
    box = W.VBox([W.HBox(list(controls.values())), out])
    box.redraw = redraw  # lets a test (or a learner) force an update
    display(box)
    return box
