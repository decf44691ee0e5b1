"""How close two computations of the same numbers must be, derived from the dtype they run in (one owner).

The CPU tests compare ftprof's paths (fused adapters, rerouted dequantization, checkpointing, FSDP2 in one
process, compiled blocks) with the reference path, in float32: the tiny preset trains in float32 on CPU, so no bf16
rounding takes part and the comparison does not depend on whether the CPU has bf16 instructions. Two fp32 paths that
do the same arithmetic in another order differ by rounding alone: a length-K dot product by at most about
K * eps * sum|a_i * b_i| (eps = 2**-23, 1.2e-7), typically sqrt(K) * eps. The tiny preset's longest reduction is its
MLP's 176 (a batch's tokens, up to 128, for weight gradients), so:

- ``SAME_OPS``: outputs and losses of one forward: 176 * eps ~ 2e-5 worst case, ~2e-6 typical: rtol 1e-5, with an
  atol for values near zero.
- ``GRADIENTS``: a backward adds two more reductions on top of the forward's: rtol 1e-4.
- ``LOSS_AFTER_STEPS``: losses after a few optimizer steps, where AdamW divides by the square root of tiny second
  moments and amplifies last-bit differences: rel 1e-4.
- ``COMPILED_LOSS``: inductor fuses and reorders whole blocks (and may skip a rounding between fused ops): rel 1e-3.

A difference beyond these is a different computation, not rounding: a wrong weight (errors of ~1 on unit-scale
values), a dropped adapter or a missing scale.
"""

SAME_OPS = {"rtol": 1e-5, "atol": 1e-6}
GRADIENTS = {"rtol": 1e-4, "atol": 1e-6}
LOSS_AFTER_STEPS = 1e-4
COMPILED_LOSS = 1e-3
