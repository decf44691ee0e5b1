"""Quantize a saved 16-bit checkpoint to GPTQ in a process of its own:
``python -m ftprof.models.gptq_quantize SRC OUT SPEC_JSON``.

The parent (``gptq.ensure_quantized``) builds the model, saves it with its tokenizer and the calibration rows, and
runs this module. Quantizing in-process left GPTQModel's device tensors alive after it was done, a ``gc.collect()``
notwithstanding, and the run counted them as its own: on an H200 with an empty cache, gptq-lora's llama-1b load
memory read 2.18 GB in-process and 1.56 GB with this child process (the rest was a tied embedding that ftprof's
dtype cast untied, fixed in ``methods.cast_frozen_parameters``). A child process gives all of it back when it
exits. SPEC_JSON: bits, group_size, quantizer (gptq or rtn), backend, device, calibration (a torch.save file of
token-id rows), logs (the folder for GPTQModel's per-module logs).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def quantize(src: str, out: str, spec: dict) -> None:
    import torch

    from ftprof.models.gptq import ensure_workers, logs_in
    from ftprof.runtime import quiet_import

    ensure_workers()
    with quiet_import():
        from gptqmodel import BACKEND, GPTQModel, QuantizeConfig
    # rtn: GPTQModel's mock path rounds each group to nearest (identity Hessian inverse) and packs the same
    # checkpoint format; it skips GPTQ's per-column error compensation (its slow part).
    qcfg = QuantizeConfig(bits=spec["bits"], group_size=spec["group_size"],
                          mock_quantization=spec["quantizer"] == "rtn")
    rows = torch.load(spec["calibration"])
    calib = [{"input_ids": ids.view(1, -1), "attention_mask": torch.ones(1, ids.numel(), dtype=torch.long)}
             for ids in rows]
    with quiet_import():  # GPTQModel prints hundreds of progress lines per layer
        model = GPTQModel.load(src, qcfg, device=spec["device"])
    with quiet_import(), logs_in(Path(spec["logs"])):
        model.quantize(calib, batch_size=1, backend=BACKEND(spec["backend"]))
        model.save(out)


def main(argv: list[str]) -> int:
    src, out, spec = argv[0], argv[1], json.loads(argv[2])
    quantize(src, out, spec)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
