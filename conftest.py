"""Root pytest configuration: the environment every notebook kernel inherits.

Notebook kernels started by nbval (and by the student-edition tests) inherit os.environ, so the
settings that make notebooks deterministic are made here, once, for every way the tests run.
"""

import os

from authoring.notebooks import EXEC_ENV

os.environ.update(EXEC_ENV)

# nbval waits a fixed 5 s for a cell's outputs after the kernel has replied. On a loaded 2-core
# machine the kernel can take longer than that to publish them after a long cell (notebook 07's
# training cell once failed this way with nothing wrong in it), so each notebook cell waits up to a
# minute; the cell's own run time is still bounded by --nbval-cell-timeout.
NBVAL_OUTPUT_TIMEOUT_S = 60


def pytest_collection_modifyitems(items):
    for item in items:
        if hasattr(item, "output_timeout"):  # nbval's notebook-cell items
            item.output_timeout = NBVAL_OUTPUT_TIMEOUT_S
