"""The README's Python example runs as written (its asserts are the claims it makes), and CI runs the README's
test command."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def test_readme_example_runs():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "README.md has no python example"
    for block in blocks:
        exec(compile(block, str(README), "exec"), {})


def test_ci_runs_the_readmes_test_command():
    """The set-up section has two commands, the comparison's and the tests'; .ci/run's last line is the second,
    character for character, so the command a reader copies is the one CI proves."""
    setup = README.read_text().split("## Set-up", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"```\n(.*?)\n```", setup, flags=re.S)
    assert len(commands) == 2 and commands[0].endswith("&& bitparity compare"), commands
    assert commands[1].endswith("&& python3 -m pytest"), commands[1]
    assert (ROOT / ".ci" / "run").read_text().rstrip("\n").rsplit("\n", 1)[1] == commands[1]
