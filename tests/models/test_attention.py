"""--sdpa-backend: the chosen backend goes first in SDPA's priority order for the run and the order comes back
after; the probe answers only on CUDA. The GPU side (cuDNN picked on an H200, loss against eager) is in
tests/gpu/test_gpu_fast_paths.py."""

import pytest
import torch
from torch.nn.attention import SDPBackend

from ftprof.errors import ConfigError
from ftprof.models import attention
from ftprof.models.presets import preset_config


@pytest.mark.parametrize("name, backend", [("cudnn", SDPBackend.CUDNN_ATTENTION),
                                           ("efficient", SDPBackend.EFFICIENT_ATTENTION),
                                           ("flash", SDPBackend.FLASH_ATTENTION)])
def test_preferred_backend_goes_first_and_the_order_comes_back(name, backend):
    before = torch._C._get_sdp_priority_order()
    with attention.preferred(name):
        order = torch._C._get_sdp_priority_order()
        assert order[0] == int(backend)
        assert sorted(order) == sorted(before)  # the others stay behind it as fallbacks
    assert torch._C._get_sdp_priority_order() == before


def test_auto_changes_nothing():
    before = torch._C._get_sdp_priority_order()
    with attention.preferred("auto"):
        assert torch._C._get_sdp_priority_order() == before


def test_order_comes_back_after_a_failure():
    before = torch._C._get_sdp_priority_order()
    with pytest.raises(RuntimeError), attention.preferred("cudnn"):
        raise RuntimeError("run failed")
    assert torch._C._get_sdp_priority_order() == before


def test_probe_answers_only_on_cuda():
    config = preset_config("tiny")
    assert attention.probe(config, 64, torch.device("cpu"), torch.float32) is None


@pytest.mark.parametrize("device, impl, fragment", [("cpu", "sdpa", "needs a CUDA device"),
                                                    ("cuda", "eager", "applies to --attn-implementation sdpa")])
def test_check_backend_is_one_line(device, impl, fragment):
    with pytest.raises(ConfigError, match=fragment):
        attention.check_backend("cudnn", device, impl)
    attention.check_backend("auto", device, impl)  # auto always runs
