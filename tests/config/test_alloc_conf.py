"""PYTORCH_ALLOC_CONF's syntax (ftprof.config.alloc_conf): what torch takes passes, what it aborts on or ignores
is named."""

import pytest

from ftprof.config import alloc_conf


@pytest.mark.parametrize("value", [
    "expandable_segments:True",
    "expandable_segments:True,max_split_size_mb:256,garbage_collection_threshold:0.7",  # what gptqmodel sets
    "roundup_power2_divisions:[256:1,512:2,1024:4,>:8],backend:native",
    "roundup_power2_divisions:4, pinned_use_cuda_host_register:False",
    "backend:cudaMallocAsync",
])
def test_settings_torch_takes_pass(value):
    assert alloc_conf.problem(value) is None


@pytest.mark.parametrize("value, words", [
    ("garbage", "is not key:value"),
    ("expandable_segments:", "is not key:value"),
    ("expandable_segments:True,", "is not key:value"),
    ("expandable_segment:True", "did you mean 'expandable_segments'"),
    ("expandable_segments:maybe", "True or False"),
    ("max_split_size_mb:-5", "non-negative number"),
    ("backend:jemalloc", "native or cudaMallocAsync"),
    ("roundup_power2_divisions:[256:1,", "roundup_power2_divisions"),
    ("", "empty"),
])
def test_what_torch_aborts_on_or_ignores_is_named(value, words):
    assert words in (alloc_conf.problem(value) or "")
