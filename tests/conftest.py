"""Shared test set-up: a repeatable Hypothesis profile and the backends under test."""

import os

import pytest
import torch
from hypothesis import HealthCheck, settings

import bitparity

# Database-free and derandomized: CI runs the same examples every time.
settings.register_profile("ci", database=None, derandomize=True, deadline=None, max_examples=60,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                 HealthCheck.function_scoped_fixture])  # backend fixtures hold only a name
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

IMPLEMENTATIONS = ("cpu", "cuda", "ascend")      # compared bit for bit with the numpy backend
# Without a GPU, the cuda backend runs in the Triton interpreter, about 10^4 times slower than the C backend.
INTERPRETED = not torch.cuda.is_available()


def backend_cases(cases, interpreter_runs):
    """pytest params (backend, *case) for every implementation and case, except that the Triton interpreter runs
    only the cases for which interpreter_runs(*case) holds (a GPU runs them all). The interpreter executes the
    same kernel code at every size; what it skips is sizes it also runs in a narrower form, named where used."""
    return [pytest.param(b, *case, id="-".join(map(str, (b, *case))))
            for b in IMPLEMENTATIONS for case in cases
            if not (b == "cuda" and INTERPRETED and not interpreter_runs(*case))]


def _checked(name):
    # The test machine has gcc, g++ and triton: an unavailable backend is a failure, never a skip.
    info = {b["name"]: b for b in bitparity.backends()}[name]
    assert info["available"], f"backend {name} unavailable: {info['reason']}"
    return name


@pytest.fixture(params=IMPLEMENTATIONS)
def backend(request):
    """Each implementation of the canonical order other than the numpy reference it is compared with."""
    return _checked(request.param)


@pytest.fixture(params=("numpy", *IMPLEMENTATIONS))
def any_backend(request):
    """Each canonical backend, the numpy reference included (for properties that hold of every one)."""
    return _checked(request.param)


def implementing(op, names=("numpy", *IMPLEMENTATIONS)):
    """The canonical backends among names whose module has op. tests/backends/test_sampling_bit_identity.py
    requires every backend to have the sampling ops, so a backend missing here fails there, not silently."""
    from bitparity.backends import _module
    return [name for name in names if hasattr(_module(_checked(name)), op)]
