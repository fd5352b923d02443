"""One vLLM cache directory for the whole session: vLLM inspects a registered model class in a subprocess (about
25 s here) unless its cache holds the class's module, so the plugin's classes are inspected once, not per
engine."""

import pytest

from .engines import use_test_environment


@pytest.fixture(scope="session", autouse=True)
def vllm_environment(tmp_path_factory):
    use_test_environment(tmp_path_factory.mktemp("vllm-cache"))
