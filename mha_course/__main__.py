"""Command line: ``python -m mha_course {sync,execute,student-edition} ...``."""

import sys

from . import notebook_tools


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "student-edition":
        from . import student_edition

        return student_edition.main(argv[1:])
    return notebook_tools.main(argv)


if __name__ == "__main__":
    sys.exit(main())
