"""Repository tools (run from the checkout's root): ``python -m authoring COMMAND ...``.

sync [NOTEBOOK ...]              Colab badges, setup cells, README's generated blocks
execute [NOTEBOOK ...]           re-execute notebooks in place, as the tests run them
student-edition OUT_DIR [--check]  build (or check) the student edition
emulate [SETTING ...]            strict nbval as on other CPUs (see authoring/emulate.py)
nbgrader COURSE_DIR [NOTEBOOK ...]  an nbgrader course from the solved notebooks (see authoring/grading.py)
progress FOLDER [--figure PNG]   a class's progress: learners x exercises (see authoring/classroom.py)
hub-links --hub URL              nbgitpuller and Colab links per notebook (see authoring/classroom.py)
"""

import sys

from . import notebooks


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "student-edition":
        from . import student_edition

        return student_edition.main(argv[1:])
    if argv and argv[0] == "emulate":
        from . import emulate

        return emulate.main(argv[1:])
    if argv and argv[0] == "nbgrader":
        from . import grading

        return grading.main(argv[1:])
    if argv and argv[0] in ("progress", "hub-links"):
        from . import classroom

        return classroom.main(argv)
    return notebooks.main(argv)


if __name__ == "__main__":
    sys.exit(main())
