"""The plain Hugging Face Trainer + PEFT recipe, timed the way ftprof times itself: the baseline of BENCHMARKS.md.

Same random-init preset architectures and the same synthetic token stream as ftprof, trained with
``transformers.Trainer`` as its documentation recipes do: bf16, fused AdamW, LoRA r=16 on the seven projections,
and for QLoRA the textbook ``prepare_model_for_kbit_training`` on a bitsandbytes NF4 checkpoint. Step time is wall
time between step begin and step end with a CUDA synchronisation at both ends; warm-up steps are dropped.

    python benchmarks/hf_baseline.py --method lora --model llama-8b --batch-size 4 --seq-len 2048 \\
        --max-steps 20 --gradient-checkpointing

Prints one JSON line (method, model, tokens_per_s, step_time_p50_s, torch_peak_allocated, ...).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

import torch

from ftprof import metrics
from ftprof.config import DEFAULT_LORA_TARGETS, DataConfig
from ftprof.data import synthetic_batches
from ftprof.models.materialize import build_random_model
from ftprof.models.presets import PRESETS, preset_config
from ftprof.models.tokenizer import build_tokenizer


class SyntheticDataset(torch.utils.data.Dataset):
    def __init__(self, seq_len: int, vocab: int, n: int, seed: int = 0):
        stream = synthetic_batches(DataConfig(seq_len=seq_len, batch_size=1), vocab, seed)
        self.rows = [next(stream)["input_ids"][0] for _ in range(n)]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i):
        ids = self.rows[i]
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}


def _timer_callback(cuda: bool):
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.times: list[float] = []

        def on_step_begin(self, args, state, control, **kw):
            if cuda:
                torch.cuda.synchronize()
            self._t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            if cuda:
                torch.cuda.synchronize()
            self.times.append(time.perf_counter() - self._t0)

    return StepTimer()


def _model(args, device: torch.device, dtype: torch.dtype):
    config = preset_config(args.model)
    if args.method in ("full", "lora"):
        return build_random_model(config, device, dtype)
    if args.method == "qlora":
        # QLoRA loads a 16-bit checkpoint quantized on the fly, as users do: write the random model once first.
        workdir = tempfile.mkdtemp(prefix="hf-baseline-")
        build_random_model(config, device, dtype).save_pretrained(workdir)
        build_tokenizer().save_pretrained(workdir)
        from transformers import AutoModelForCausalLM, BitsAndBytesConfig

        bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                 bnb_4bit_compute_dtype=dtype)
        return AutoModelForCausalLM.from_pretrained(workdir, quantization_config=bnb, dtype=dtype,
                                                    device_map={"": str(device)})
    # The GPTQ checkpoint comes from ftprof's quantize-once cache (same key as `ftprof train gptq-lora` with the
    # same preset, seed and sequence length): quantizing is a one-off cost, not part of either training recipe.
    from ftprof.config import MethodConfig
    from ftprof.models import gptq

    method = MethodConfig(method="gptq-lora").resolved("bfloat16", preset=True)
    key = gptq.cache_key(config, method, 0, args.seq_len)
    stream = synthetic_batches(DataConfig(seq_len=args.seq_len, batch_size=1), config.vocab_size, 0)
    path = gptq.ensure_quantized(lambda: build_random_model(config, device, torch.float16), build_tokenizer(),
                                 args.model, key, method,
                                 lambda: [next(stream)["input_ids"][0] for _ in range(method.gptq_calibration_samples)],
                                 device)
    gptq.ensure_workers()
    from gptqmodel import BACKEND, GPTQModel

    model = GPTQModel.load(str(path), device=str(device), backend=BACKEND.GPTQ_TORCH).model
    # GPTQModel loads the non-quantized parts in fp16; prepare_model_for_kbit_training (below) upcasts them to
    # fp32, as the textbook recipe does, and the Trainer runs the forward under bf16 autocast.
    return model


def run(args) -> dict:
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
    from transformers import Trainer, TrainingArguments

    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    model = _model(args, device, dtype)
    if args.method in ("qlora", "gptq-lora"):
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=args.gradient_checkpointing)
    if args.method != "full":
        model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules=list(DEFAULT_LORA_TARGETS),
                                                 task_type="CAUSAL_LM"))
    data = SyntheticDataset(args.seq_len, preset_config(args.model).vocab_size,
                            args.batch_size * (args.max_steps + 1))
    targs = TrainingArguments(output_dir=tempfile.mkdtemp(prefix="hf-baseline-out-"), max_steps=args.max_steps,
                              per_device_train_batch_size=args.batch_size, learning_rate=2e-4, bf16=cuda,
                              gradient_checkpointing=args.gradient_checkpointing,
                              gradient_checkpointing_kwargs={"use_reentrant": False},
                              optim="adamw_torch_fused" if cuda else "adamw_torch", logging_steps=10 ** 6,
                              save_strategy="no", report_to=[], dataloader_num_workers=0, use_cpu=not cuda,
                              use_liger_kernel=args.liger)  # the Trainer's own Liger switch (patches the instance)
    # FLOPs per token by the README's MFU convention, counted on the model as trained (the same count ftprof uses)
    config = preset_config(args.model)
    layers, attn_dim = metrics.attention_dims(config)
    flops = metrics.flops_per_token(metrics.count_params(model), layers, attn_dim, args.seq_len)
    timer = _timer_callback(cuda)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    Trainer(model=model, args=targs, train_dataset=data, callbacks=[timer]).train()
    steady = timer.times[args.warmup_steps:]
    p50 = statistics.median(steady)
    tokens_per_s = args.batch_size * args.seq_len * len(steady) / sum(steady)
    peak = metrics.peak_flops(torch.cuda.get_device_name()) if cuda else None
    return {"recipe": "hf-trainer", "method": args.method, "model": args.model, "batch_size": args.batch_size,
            "seq_len": args.seq_len, "gradient_checkpointing": args.gradient_checkpointing, "liger": args.liger,
            "device": torch.cuda.get_device_name() if cuda else "cpu", "steps": len(steady),
            "step_time_p50_s": p50, "tokens_per_s": tokens_per_s, "flops_per_token": flops,
            "mfu": tokens_per_s * flops / peak if peak else None,
            "torch_peak_allocated": torch.cuda.max_memory_allocated() if cuda else None,
            "versions": {m: __import__(m).__version__ for m in ("torch", "transformers", "peft")}}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--method", choices=("full", "lora", "qlora", "gptq-lora"), required=True)
    p.add_argument("--model", choices=sorted(PRESETS), default="tiny")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--max-steps", type=int, default=20)
    p.add_argument("--warmup-steps", type=int, default=3)
    p.add_argument("--gradient-checkpointing", action="store_true")
    p.add_argument("--liger", action="store_true", help="TrainingArguments(use_liger_kernel=True)")
    args = p.parse_args(argv)
    if args.max_steps <= args.warmup_steps:
        p.error("--max-steps must exceed --warmup-steps")
    print(json.dumps(run(args)), flush=True)


if __name__ == "__main__":
    main()
