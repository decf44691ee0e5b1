"""Every run gets a speed prediction where any related class is calibrated: selective checkpointing without a run
of its own class stands in as selective compares with none in a class that has both, with a wider error band."""

from __future__ import annotations

from tests.plan.planners import planner_for


def _predict(method="qlora", **flat):
    planner, cand = planner_for("tiny", method, seq_len=64, batch_size=4, **flat)
    return planner.predict(cand)


def test_selective_without_a_run_of_its_class_gets_a_stand_in_prediction():
    stand_in = _predict(checkpointing="selective")  # qlora selective eager uncompiled: no shipped run of it
    none = _predict(checkpointing="none")
    assert stand_in.tokens_per_s and "selective against none for" in stand_in.speed_source
    assert stand_in.tokens_per_s < none.tokens_per_s  # selective recomputes what FLOPs do not count
    assert stand_in.tokens_per_s_error >= none.tokens_per_s_error + 0.10  # and says it is less sure


def test_a_cuda_graph_fp8_run_is_predicted():
    pred = _predict(checkpointing="none", kernels="liger", compile=True, compile_mode="reduce-overhead",
                    fp8_base=True)
    assert pred.tokens_per_s and pred.candidate["compile_mode"] == "reduce-overhead"


def test_compiled_selective_stands_in_as_compiled_selective_of_another_method_measures():
    """Compiled selective costs little against none (0.93 of its rate, llama-8b QLoRA on an H200), uncompiled
    selective much more: a compiled class without a run of its own takes a compiled pair's ratio first, of
    another adapter method where its own has none."""
    pred = _predict(method="lora", checkpointing="selective", kernels="liger", compile=True)
    assert pred.tokens_per_s and "selective against none for qlora selective" in pred.speed_source
    assert " compiled" in pred.speed_source.split("selective against none for")[1]
    assert "uncompiled" not in pred.speed_source.split("selective against none for")[1]


def test_uncompiled_fp8_stands_in_as_compiled_fp8_times_what_compile_does_in_16_bits():
    uncompiled = _predict(checkpointing="full", kernels="liger", fp8_base=True)
    compiled = _predict(checkpointing="full", kernels="liger", compile=True, fp8_base=True)
    assert uncompiled.tokens_per_s and "no qlora full liger uncompiled fp8 run" in uncompiled.speed_source
    assert "qlora full liger uncompiled against qlora full liger compiled" in uncompiled.speed_source
    assert uncompiled.tokens_per_s < compiled.tokens_per_s  # compile's gain in 16 bits carries over
    assert uncompiled.tokens_per_s_error > compiled.tokens_per_s_error  # and a stand-in says it is less sure


def test_a_gptq_lora_class_without_runs_stands_in_as_qlora_measures_the_difference():
    pred = _predict(method="gptq-lora", checkpointing="full", kernels="liger")  # uncompiled: no GPTQ-LoRA run
    assert pred.tokens_per_s and "no gptq-lora full liger uncompiled run" in pred.speed_source
    assert "against" in pred.speed_source
