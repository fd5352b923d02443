"""The `bitparity` command's own surface: its version, its help, and which parser reports a bad flag."""

import importlib.util
import re
from pathlib import Path

import pytest

import bitparity
from bitparity import SPEC_VERSION, cli

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def test_version_is_the_installed_distributions_which_is_pyprojects():
    assert bitparity.__version__ == re.search(r'^version = "(.+)"$', PYPROJECT.read_text(), re.M).group(1)


def test_version_flag_prints_the_package_and_spec_versions(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"bitparity {bitparity.__version__} (spec {SPEC_VERSION})\n"


def test_help_shows_the_user_description_not_the_modules_developer_note(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "1000")         # no wrapping: each paragraph of the help is one line
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert cli.DESCRIPTION in out
    notes = [" ".join(paragraph.split()) for paragraph in cli.__doc__.split("\n\n")]
    assert not [note for note in notes if note in out]


@pytest.mark.parametrize("argv", (["verify", "--backend", "cpu", "--bogus"], ["rl-check", "--quick"]),
                         ids=lambda argv: argv[0])
def test_a_bad_flag_after_a_subcommand_is_reported_with_that_subcommands_usage(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: bitparity {argv[0]} [-h]")
    assert err.endswith(f"bitparity {argv[0]}: error: unrecognized arguments: {argv[-1]}\n")


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed: tests/vllm runs it")
def test_rl_check_rollout_vllm_without_vllm_says_what_to_install(capsys):
    assert cli.main(["rl-check", "--model", "qwen3", "--rollout", "vllm"]) == 2
    assert "--rollout vllm needs vLLM with bitparity's plugin (pip install 'bitparity[vllm]')" in capsys.readouterr().err
