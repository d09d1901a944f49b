"""Reading back a pip command that kimi_pinset.build_pip_command built.

Shared by the recorder of the pip fixtures (tests/fixtures/stack/pip/record.py, run as a script with the
repository root on sys.path) and their replay (tests/unit/plugins/module_utils/test_kimi_pinset.py): the
replay finds a recorded run by the requirements its command asked for, so both sides must read them the same
way.
"""

from __future__ import annotations

# Index options build_pip_command puts after `--target TARGET` whose value is not a requirement.
OPTIONS_WITH_VALUE = frozenset({"--index-url", "--extra-index-url", "--find-links", "--trusted-host", "--cert"})


def requirements_of(command: list[str]) -> list[str]:
    """The requirements at the end of a pip command, past `--target TARGET` and the index options after it."""
    requirements: list[str] = []
    skip = False
    for arg in command[command.index("--target") + 2 :]:
        if skip:
            skip = False
        elif arg in OPTIONS_WITH_VALUE:
            skip = True
        elif not arg.startswith("-"):
            requirements.append(arg)
    return requirements
