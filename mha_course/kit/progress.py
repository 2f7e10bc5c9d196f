"""Progress bars that an executed notebook stores as finished.

``progress_bar(...)`` takes ``tqdm.auto.tqdm``'s arguments and returns such a bar. In a live
notebook it is the usual widget (ipywidgets 7.7 and 8 alike). The difference is what an executed
notebook keeps: a widget's output stores, for viewers without widgets (GitHub, nbviewer, the
course website), the text it had when it was first shown, so a training cell would read
``training: 0%| 0/250`` forever. This bar is shown with a display id, and when it closes its output
is updated (``update_display_data``, which nbclient applies to the stored output) with the bar's
final text, ``training: 100%|██████████| 250/250`` (its count, not its timing, so that re-running
a notebook changes nothing). Outside a notebook it is tqdm's text bar.
"""

from __future__ import annotations

from tqdm.auto import tqdm as _auto_tqdm
from tqdm.std import tqdm as _text_tqdm

__all__ = ["progress_bar", "final_text", "FINAL_FORMAT"]

#: what a finished bar's stored text shows: description, percentage, bar and count (no timing)
FINAL_FORMAT = "{l_bar}{bar}| {n_fmt}/{total_fmt}"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def final_text(bar: _text_tqdm) -> str:
    """The bar's text as it stands, without elapsed time or rate, e.g. ``training: 100%|██████████| 250/250``."""
    fields = {**bar.format_dict, "bar_format": FINAL_FORMAT, "ascii": False, "ncols": None}
    return bar.format_meter(**fields)


def progress_bar(*args, **kwargs) -> _text_tqdm:
    """A ``tqdm.auto`` progress bar (same arguments: ``total``, ``desc``, an iterable ...) whose
    executed-notebook output is its final text. Use it as a context manager, iterate over it, or
    ``close()`` it: the stored text is written when the bar closes."""
    if _auto_tqdm is _text_tqdm or not issubclass(_auto_tqdm, _notebook_tqdm()):
        return _auto_tqdm(*args, **kwargs)  # no notebook here: tqdm's text bar
    return _stored_bar_class()(*args, **kwargs)


def _notebook_tqdm():
    from tqdm.notebook import tqdm_notebook

    return tqdm_notebook


_CLASS = None


def _stored_bar_class():
    """tqdm.auto's notebook bar, shown under a display id and updated with its final text on close."""
    global _CLASS
    if _CLASS is not None:
        return _CLASS
    from IPython.display import display

    class StoredProgressBar(_auto_tqdm):
        def __init__(self, *args, **kwargs):
            show = kwargs.pop("display", True)
            self._handle = None
            super().__init__(*args, display=False, **kwargs)
            if show and not self.disable and self.delay <= 0:
                self._handle = display(self._bundle(repr(self.container)), raw=True, display_id=True)
                self.displayed = True

        def _bundle(self, text: str) -> dict:
            view = {"version_major": 2, "version_minor": 0, "model_id": self.container.model_id}
            return {"text/plain": text, WIDGET_VIEW: view}

        def close(self):
            was_open = not self.disable
            super().close()
            if was_open and self._handle is not None and self.leave:
                self._handle.update(self._bundle(final_text(self)), raw=True)
                self._handle = None

    _CLASS = StoredProgressBar
    return _CLASS
