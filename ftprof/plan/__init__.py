"""``ftprof plan``: predict each configuration's peak memory per GPU and tokens/s before anything trains.

One predictor serves ``ftprof plan``, ``--checkpointing auto`` and ``--memory-limit-gib``; every run records the
prediction it was given (result.json's ``prediction``) and feeds the calibration store, so the report can publish
the predictor's error.

The planner sits below the engine, bench and report: it imports none of them (``--verify`` runs through
ftprof/bench/verify.py).

- probe.py        activations per token and static bytes, measured on a two-layer copy of the model (host CPU)
- memory.py       peak memory per GPU: static bytes + activations + transients, by policy and micro-batch
- calibration.py  the local calibration store (every run and profile feeds it) and the shipped defaults
- speed.py        tokens/s from FLOPs per token and the calibrated rate
- candidates.py   the configurations worth predicting for a model and shape
- predict.py      a candidate -> Prediction (result.json's record); the one entry point the engine calls
- accuracy.py     prediction against measurement (what "measured" means per device), for report and --verify
- output.py       the ranked table, plan.json, plan.csv, the sweep YAML of the top K
"""
