"""analysis/rules.py: what kernel names mean, inductor's generated kernels included."""

import pytest

from ftprof.analysis.rules import categorize


@pytest.mark.parametrize("name, category", [
    # a compiled FP8 layer's norm and input quantization: a cast among its operators, computing (round 23's profile
    # had 13% of the GPU's time under "memory copy" from kernels like these)
    ("triton_red_fused__scaled_mm__to_copy__unsafe_view_abs_add_amax_clamp_div_mul_3", "elementwise"),
    ("triton_per_fused__to_copy_add_mean_mul_pow_rsqrt_2", "elementwise"),
    ("triton_poi_fused_add_clone_fp8_linear_input_grad_mul_transpose_unsqueeze_5", "elementwise"),
    # kernels that only cast, copy or move data stay copies
    ("triton_poi_fused__to_copy_0", "memory copy"),
    ("triton_poi_fused__unsafe_view_clone_transpose_4", "memory copy"),
    ("triton_poi_fused_cat_1", "memory copy"),
    ("void at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)", "memory copy"),
    ("Memcpy DtoD (Device -> Device)", "memory copy"),
    # templates are GEMMs; attention stays attention
    ("triton_tem_fused_addmm_mul_0", "gemm"),
    ("triton_poi_fused__scaled_dot_product_cudnn_attention_backward_add_transpose_3", "attention"),
    # names outside inductor's are read as before
    ("nvjet_sm90_qqtst_128x128_128x6_1x1_h_bz_coopA_algo2_ovscale_TNT", "gemm"),
    ("dequantize_4bit_transposed_kernel", "quantize/dequantize"),
    # the loss's log-softmax and NLL are the loss's, not attention's softmax
    ("aten::_log_softmax", "loss"), ("aten::_log_softmax_backward_data", "loss"), ("aten::nll_loss_forward", "loss"),
    ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, at::native::(anonymous "
     "namespace)::LogSoftMaxForwardEpilogue>(float*, float const*, int)", "loss"),
    ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<8, c10::BFloat16, float, c10::BFloat16, "
     "at::native::(anonymous namespace)::SoftMaxForwardEpilogue>", "attention"),
])
def test_kernel_names_are_categorized_by_what_they_compute(name, category):
    assert categorize(name) == category
