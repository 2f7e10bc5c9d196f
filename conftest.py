"""Root pytest configuration: the environment every notebook kernel inherits.

Notebook kernels started by nbval (and by the student-edition tests) inherit os.environ, so the
settings that make notebooks deterministic are made here, once, for every way the tests run.
"""

import os

from authoring.notebooks import EXEC_ENV

os.environ.update(EXEC_ENV)
