"""Peer recipes as bench cells: the training people already run, measured by FtprofCallback into a standard ftprof
run directory beside ftprof's own cells (one FLOP count, one steady window, one report).

One module per recipe, each run in its own process by ``ftprof bench`` for a cell with ``trainer: <name>``::

    python -m ftprof.integrations.recipes.hf      --config RUN_DIR/peer_config.json --run-dir RUN_DIR
    python -m ftprof.integrations.recipes.trl     ...   # TRL's SFTTrainer (SFTConfig, packing as the cell says)
    python -m ftprof.integrations.recipes.unsloth ...   # Unsloth's FastLanguageModel (where it is installed)

- ``hf``: ``AutoModelForCausalLM`` from the checkpoint (a preset is written once as a random-init checkpoint in
  ftprof's cache), bitsandbytes 4-bit NF4 for qlora with PEFT's ``prepare_model_for_kbit_training`` (the textbook
  recipe), ``get_peft_model``, ``transformers.Trainer``;
- ``trl``: the same model, ``SFTTrainer`` with ``peft_config`` and ``SFTConfig`` (TRL prepares and collates the
  rows itself: padding per batch, or packing);
- ``unsloth``: ``FastLanguageModel.from_pretrained`` / ``get_peft_model`` (its checkpointing, ``"unsloth"``, for
  ``checkpointing: full``), TRL's SFTTrainer.

Every recipe takes the cell's validated RunConfig (method, model, data, shape, LoRA, optimizer, schedule, steps) and
spells it in its library: docs/integrations.md lists how. Nothing is downloaded.
"""

RECIPES = ("hf", "trl", "unsloth")
