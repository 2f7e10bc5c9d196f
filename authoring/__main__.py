"""Repository tools (run from the checkout's root): ``python -m authoring COMMAND ...``.

For a class, ``python3 course.py class COMMAND ...`` runs the class commands below in the course's
environment (.venv/), with nothing activated, and installs nbgrader on first use.
"""

import sys

#: command -> (module of authoring, its arguments, what it does); ``--help`` lists every one
COMMANDS = {
    "sync": ("notebooks", "[NOTEBOOK ...]", "Colab badges, setup cells, README's generated blocks"),
    "execute": ("notebooks", "[NOTEBOOK ...]", "re-execute notebooks in place, as the tests run them"),
    "student-edition": ("student_edition", "OUT_DIR [--check]", "build (or check) the student edition"),
    "emulate": ("emulate", "[SETTING ...]", "strict nbval as on other CPUs (see authoring/emulate.py)"),
    "translate": ("translate", "--check|--update|--build|--lint|--stats", "the Chinese edition: catalogues, notebooks"),
    "suite-times": ("suite_times", "[PYTEST ARGS]", "run tests, then print the 20 slowest"),
    "nbgrader": ("grading", "COURSE_DIR [NOTEBOOK ...]", "an nbgrader course and its releases (class)"),
    "autograde": ("grading", "COURSE_DIR ASSIGNMENT", "nbgrader autograde, then each learner's score (class)"),
    "feedback": ("grading", "COURSE_DIR ASSIGNMENT", "nbgrader generate_feedback (class)"),
    "progress": ("classroom", "FOLDER [--gradebook DB] [--figure PNG]", "learners x exercises (class)"),
    "hub-links": ("classroom", "--hub URL [--edition student|solved]", "nbgitpuller and Colab links (class)"),
}


def help_text() -> str:
    width = max(len(f"{name} {args}") for name, (_, args, _) in COMMANDS.items())
    lines = [__doc__.strip(), "", "commands:"]
    lines += [f"  {f'{name} {args}':<{width}}  {what}" for name, (_, args, what) in COMMANDS.items()]
    lines += ["", "`python -m authoring COMMAND --help` says more about one."]
    return "\n".join(lines)


def main(argv=None) -> int:
    import importlib

    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(help_text())
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"python -m authoring: no command {command!r}\n\n{help_text()}")
        return 2
    module = importlib.import_module(f".{COMMANDS[command][0]}", __package__)
    if command in ("sync", "execute", "progress", "hub-links"):  # these modules read the command name
        return module.main(argv)
    if command in ("autograde", "feedback"):
        return getattr(module, f"{command}_main")(rest)
    return module.main(rest)


if __name__ == "__main__":
    sys.exit(main())
