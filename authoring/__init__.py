"""Repository-only tools for course authors: notebook sync and execution, the student edition,
CPU emulation of the notebook tests. Run from a checkout (``python -m authoring ...``); never
shipped to learners and never imported by ``mha_course``."""

import sys

#: imports these tools decline: jsonschema (under nbformat, nbconvert and nbgrader) imports
#: rfc3987_syntax for its optional "iri" format check, and that module builds 39 Earley parsers
#: while it is imported, 1.3 s at the start of every ``python -m authoring`` command and every
#: nbgrader run. No schema validated here (notebooks, nbgrader's) uses that format; declined,
#: jsonschema leaves that one format unchecked. (A process that imported it already keeps it.)
DECLINED_IMPORTS = ("rfc3987_syntax",)
for _name in DECLINED_IMPORTS:
    sys.modules.setdefault(_name, None)
