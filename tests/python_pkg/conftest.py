"""pytest setup for the Python package tests.

`import qsdpa` must find the built package: either installed (`pip install .`) or from a CMake
build with -DQSDPA_PYTHON=ON (`PYTHONPATH=<build>/python`). QSDPA_TEST_BACKEND picks the host
backend the tests run on (default: cpu; e.g. QSDPA_TEST_BACKEND=reference).
"""
import pytest

try:
    import qsdpa
except ImportError as e:  # pragma: no cover - a setup problem, said plainly
    raise ImportError(
        "cannot import qsdpa: install it (python3 -m pip install .) or point PYTHONPATH at a "
        f"CMake build made with -DQSDPA_PYTHON=ON (PYTHONPATH=build/python): {e}") from e

from qsdpa_numpy_ref import BACKEND


def pytest_report_header(config):
    return [f"qsdpa {qsdpa.__version__} from {qsdpa.__file__}; host backend under test: {BACKEND}",
            "qsdpa build: " + qsdpa.build_info().replace("\n", "; ")]


@pytest.fixture
def rng(request):
    """A generator seeded from the test's name, so that each test draws its own inputs."""
    import zlib

    import numpy as np

    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))
