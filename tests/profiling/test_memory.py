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


def test_static_parts_on_another_device_are_offloaded_bytes():
    """Under --fsdp-cpu-offload weights, gradients and optimizer state live on the host: a GPU run's breakdown
    counts them apart from the device's parts (here a CPU model read as a CUDA run's)."""
    from ftprof.profiling.memory import static_breakdown

    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    model[0].weight.requires_grad_(False)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
    model(torch.randn(3, 8)).sum().backward()
    opt.step()
    here = static_breakdown(model, opt, "cpu")
    assert here == {"weights_frozen": 8 * 8 * 4, "weights_trainable": (8 + 16 + 2) * 4,
                    "gradients": (8 + 16 + 2) * 4, "optimizer_state": 2 * (8 + 16 + 2) * 4 + 3 * 4}
    assert static_breakdown(model, opt) == here
    away = static_breakdown(model, opt, "cuda")
    assert away == {"weights_frozen": 0, "weights_trainable": 0, "gradients": 0, "optimizer_state": 0,
                    "offloaded": sum(here.values())}
