"""ftprof.profiling.memory's activation meter: what it counts, and that it leaves autograd's graph as it was."""

import gc
import weakref

import torch

from ftprof.profiling.memory import SavedActivations


def test_saved_activations_leave_no_reference_cycle():
    """A forward that never runs backward (auto's probes) frees its graph as soon as the loss goes, without the
    garbage collector: a saved output packed as itself would hold its own grad_fn."""
    gc.disable()
    try:
        x = torch.randn(4, 4, requires_grad=True)
        with SavedActivations(torch.nn.Linear(1, 1)) as meter:
            y = x.exp()  # exp saves its output for backward
            loss = y.sum()
        ref = weakref.ref(y)
        assert meter.bytes == 4 * 4 * 4
        del y, loss
        assert ref() is None
    finally:
        gc.enable()


def test_saved_activations_keep_gradients_exact():
    layer = torch.nn.Linear(8, 8)
    x = torch.randn(3, 8, requires_grad=True)
    expected = torch.autograd.grad(layer(x).exp().tanh().sum(), (x, layer.weight))
    with SavedActivations(layer) as meter:
        loss = layer(x).exp().tanh().sum()
    got = torch.autograd.grad(loss, (x, layer.weight))
    assert meter.bytes > 0 and all(torch.equal(a, b) for a, b in zip(expected, got, strict=True))
