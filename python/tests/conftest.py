import numpy as np
import pytest


@pytest.fixture
def rng():
    return np.random.default_rng(20261)


@pytest.fixture
def X(rng):
    """Inputs N×d with varied norms (so the kernel is not a function of angles only)."""
    return rng.normal(size=(12, 5)) * np.linspace(0.5, 2.0, 12)[:, None]
