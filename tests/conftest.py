import os
import warnings

import pytest
import torch

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
warnings.filterwarnings("ignore", message=".*Triton is not supported.*")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run on the GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def results(tmp_path):
    return tmp_path / "results"


@pytest.fixture
def one_thread():
    """One intra-op thread: on a loaded 2-core machine two OpenMP threads make tiny matmuls 1000x slower."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
