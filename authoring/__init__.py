"""Repository-only tools for course authors: notebook sync and execution, the student edition,
CPU emulation of the notebook tests. Run from a checkout (``python -m authoring ...``); never
shipped to learners and never imported by ``mha_course``."""
