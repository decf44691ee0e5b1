import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """One intra-op thread: on a 2-core machine shared with other work, two threads' spin-waits make step times
    swing tenfold (0.03 s to 2.5 s for the same step), which no timing comparison survives."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
