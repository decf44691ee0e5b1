"""What ``ftprof plan`` shows and writes: the ranked table (rich in a terminal), plan.json and plan.csv (every
candidate, bytes and tokens/s), and plan-sweep.yaml: the top K configurations that fit, ready for ``ftprof bench``.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from ftprof.config import SCHEMA_VERSION
from ftprof.config.declarations import BY_NAME
from ftprof.console import fmt_gib_digits as gib
from ftprof.metrics import BUDGET_MARGIN_WORDS, GIB
from ftprof.plan.candidates import REST, pin_words, policy_words
from ftprof.plan.make import Plan, Row
from ftprof.results.store import write_text_atomic

JSON_NAME, CSV_NAME, SWEEP_NAME = "plan.json", "plan.csv", "plan-sweep.yaml"
COLUMNS = ("rank", "method", "checkpointing", "checkpoint_layers", "kernels", "compile", "options", "batch_size",
           "grad_accum", "fits", "peak_gib", "headroom_gib", "tokens_per_s", "tokens_per_s_error", "confidence",
           "static_gib", "activation_gib", "transient_gib", "tie", "why_not", "memory_source", "speed_source",
           "needs_package")


def _gib(nbytes: float | None) -> float | None:
    return None if nbytes is None else round(nbytes / GIB, 4)


def row_dict(rank: int, row: Row, needs: str = "") -> dict:
    """One row's columns; ``needs``: the package its method needs that the planning machine lacks (rows kept for
    --gpu NAME)."""
    c, p = row.candidate, row.prediction
    return {"rank": rank, "method": c.method, "checkpointing": c.checkpointing,
            "checkpoint_layers": c.checkpoint_layers, "kernels": c.kernels, "compile": c.compile,
            "options": " ".join(BY_NAME[n].spell(v) for n, v in c.options),  # the declared options it sets
            "batch_size": c.batch_size, "grad_accum": c.grad_accum, "fits": row.fits,
            "peak_gib": _gib(p.peak_bytes), "headroom_gib": _gib(row.headroom_bytes),
            "tokens_per_s": None if p.tokens_per_s is None else round(p.tokens_per_s),
            "tokens_per_s_error": p.tokens_per_s_error, "confidence": p.confidence,  # (the band: relative, +-)
            # the peak's parts: what stays resident, the activations, the largest transient on top
            "static_gib": _gib(p.static_bytes), "activation_gib": _gib(p.activation_bytes),
            "transient_gib": _gib(p.transient_bytes), "tie": row.tie or "", "why_not": row.why_not,
            "memory_source": p.memory_source, "speed_source": p.speed_source, "needs_package": needs}


def plan_json(plan: Plan) -> dict:
    req = plan.request
    return {"model": req.cfg.model.model, "seq_len": req.cfg.data.seq_len, "methods": list(req.methods),
            "target": plan.target.device_name, "gpus": plan.target.world_size,
            "usable_bytes": plan.usable_bytes, "usable_from": plan.usable_from, "margin_bytes": plan.margin_bytes,
            "budget_bytes": plan.budget_bytes, "seconds": round(plan.seconds, 2),
            "probe_seconds": round(plan.probe_seconds, 2), "notes": list(req.notes),
            "peers": [_peer_dict(r) for r in plan.peers],
            "rows": [{**row_dict(i + 1, r, req.needs(r.candidate.method)), "prediction": r.prediction.to_dict()}
                     for i, r in enumerate(plan.rows)]}


def _peer_dict(record: dict) -> dict:
    return {k: record.get(k) for k in ("trainer", "method", "policy", "tokens_per_s", "training_peak", "batch_size",
                                       "grad_accum", "run_dir", "finished_at")}


def peer_lines(plan: Plan) -> list[str]:
    """What other trainers measured on this machine at the plan's model and shape (their runs in the store), to set
    the plan's rows beside: one line each, fastest first."""
    if not plan.peers:
        return []
    lines = ["measured here with other trainers (same model, sequence length and sequences per step):"]
    for r in plan.peers:
        peak = f", {r['training_peak'] / GIB:.2f} GiB peak" if r.get("training_peak") else ""
        lines.append(f"  {r['trainer']}: {r.get('method')}, checkpointing {r.get('policy')}, {r.get('batch_size')} x "
                     f"{r.get('grad_accum') or 1}: {r.get('tokens_per_s') or 0:,.0f} tokens/s{peak} "
                     f"({str(r.get('finished_at') or '')[:10]}, {r.get('run_dir')})")
    return lines


def sweep_name(model: str) -> str:
    """The name of the sweep of a plan's rows (what its --verify folder records)."""
    return f"plan-{model.strip('/').split('/')[-1]}"


def sweep_yaml(plan: Plan, top: int, base: dict, name: str | None = None) -> str:
    """A sweep of the top ``top`` configurations that fit: ``base`` (the options given) plus one experiment each;
    ``name``: the sweep's (default: the plan's, ``sweep_name``)."""
    import yaml

    experiments = [r.candidate.flat() for r in plan.fitting[:top]]
    name = name or sweep_name(plan.request.cfg.model.model)
    # schema_version: the options mean today's (without it a sweep is read as version 1: a constant learning rate)
    text = yaml.safe_dump({"name": name, "schema_version": SCHEMA_VERSION, "base": base, "experiments": experiments},
                          sort_keys=False)
    return f"# ftprof plan's top {len(experiments)} for {plan.target.device_name}: run with ftprof bench\n{text}"


def write(plan: Plan, out_dir: Path, top: int, base: dict) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / JSON_NAME, "csv": out_dir / CSV_NAME, "sweep": out_dir / SWEEP_NAME}
    write_text_atomic(paths["json"], json.dumps(plan_json(plan), indent=1) + "\n")
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=COLUMNS)
    writer.writeheader()
    for i, r in enumerate(plan.rows):
        writer.writerow(row_dict(i + 1, r, plan.request.needs(r.candidate.method)))
    write_text_atomic(paths["csv"], buf.getvalue())
    write_text_atomic(paths["sweep"], sweep_yaml(plan, top, base))
    return paths


def table(plan: Plan, shown: int):
    """The ranked table: every configuration that fits up to ``shown``, then the closest few that do not."""
    from rich.table import Table

    t = Table(title=header(plan), header_style="bold")
    for name in ("#", "method", "checkpointing", "kernels", "compile", "options", "batch x accum", "peak GiB",
                 "headroom GiB", "tokens/s", "+-", "note"):
        t.add_column(name, justify="right" if name in ("#", "peak GiB", "headroom GiB", "tokens/s") else "left")
    rows = plan.fitting[:shown] + [r for r in plan.rows if not r.fits][:3]
    for r in rows:
        d = row_dict(plan.rows.index(r) + 1, r)
        ckpt = policy_words(r.candidate, plan.layer_count)
        options = " ".join(BY_NAME[n].spell(v) for n, v in r.candidate.options if n != REST)
        t.add_row(str(d["rank"]), d["method"], ckpt, d["kernels"], "yes" if d["compile"] else "no",
                  options or "-", f"{d['batch_size']} x {d['grad_accum']}", gib(r.prediction.peak_bytes),
                  ("+" if r.headroom_bytes >= 0 else "-") + gib(abs(r.headroom_bytes)),
                  "-" if d["tokens_per_s"] is None else f"{d['tokens_per_s']:,}",
                  "-" if r.prediction.tokens_per_s_error is None else f"{r.prediction.tokens_per_s_error:.0%}",
                  note(plan, r), style=None if r.fits else "dim")
    return t


def note(plan: Plan, row: Row) -> str:
    """The table's note: why a row does not fit or how it was ranked, and a package this machine lacks."""
    needs = plan.request.needs(row.candidate.method)
    return "; ".join(x for x in (row.why_not or row.tie, f"needs {needs} here" if needs else "") if x)


def header(plan: Plan) -> str:
    """What was planned: model, shape, GPU and budget."""
    cfg = plan.request.cfg
    seqs = cfg.data.batch_size * cfg.train.grad_accum
    gpus = f" x{plan.target.world_size}" if plan.target.world_size > 1 else ""
    pins = f"; only {pin_words(dict(plan.request.pins))}, as given" if plan.request.pins else ""
    return (f"ftprof plan: {cfg.model.model}, seq {cfg.data.seq_len}, {seqs} sequences ({seqs * cfg.data.seq_len:,} "
            f"tokens) per optimizer step per GPU, on {plan.target.device_name}{gpus}; budget "
            f"{plan.budget_bytes / GIB:.1f} GiB per GPU ({plan.usable_from}, less a {plan.margin_bytes / GIB:.1f} GiB "
            f"margin){pins}")


def command(plan: Plan, row: Row, base: dict) -> str:
    """The ``ftprof train`` line that runs ``row``: the plan's own options (``base``) and the row's."""
    import shlex

    options = {**base, **{k: v for k, v in row.candidate.flat().items() if k != "method"}}
    words = ["ftprof", "train", row.candidate.method]
    for name, value in options.items():
        flag = "--" + name.replace("_", "-")
        if value is None or value is False or (name == "kernels" and value == "eager") \
                or (name == "checkpointing" and value == "none") or (name == "grad_accum" and value == 1):
            continue
        text = (",".join(map(str, value)) if isinstance(value, (list, tuple)) else f"{value:g}"
                if isinstance(value, float) else str(value))
        words += [flag] if value is True else [flag, text]
    return " ".join(shlex.quote(w) for w in words)


def ranking_note(plan: Plan) -> str | None:
    """How the rows were ordered where not by predicted speed."""
    if plan.fitting and all(r.prediction.tokens_per_s is None for r in plan.fitting):
        return (f"no speed calibration for {plan.target.device_name}: the rows are ranked by predicted peak memory, "
                "least first; run ftprof once on that GPU, or plan for a calibrated one with --gpu (e.g. h200)")
    unpriced = sum(1 for r in plan.fitting if r.prediction.tokens_per_s is None)
    if unpriced:
        return (f"{unpriced} configuration(s) that fit have no speed prediction (no run of their kind on "
                f"{plan.target.device_name} nor one to stand in): ranked after those that have one, least memory "
                "first (plan.csv's speed_source says which)")
    return None


def margin_note(plan: Plan, base: dict) -> str | None:
    """The fastest configuration left out by the budget's margin alone (its predicted peak within what a run may
    use), where it is predicted faster than the top row beyond the top row's error: the user decides whether the
    margin is worth it (a 24 GiB card: the margin of 1.9 GiB left out llama-8b's FP8 CUDA-graph cell at 22.45 GiB,
    18,788 tokens/s against the top pick's 16,632, H200, 2026-12-04)."""
    if not plan.fitting or plan.fitting[0].prediction.tokens_per_s is None:
        return None
    top = plan.fitting[0].prediction
    inside = [r for r in plan.rows if not r.fits and r.prediction.tokens_per_s
              and r.prediction.peak_bytes <= plan.usable_bytes]
    if not inside:
        return None
    best = max(inside, key=lambda r: r.prediction.tokens_per_s)
    lead = best.prediction.tokens_per_s / top.tokens_per_s - 1
    if lead <= (top.tokens_per_s_error or 0.0):
        return None
    return (f"inside the margin: #{plan.rows.index(best) + 1} is predicted {best.prediction.tokens_per_s:,.0f} "
            f"tokens/s (+{lead:.0%} over #1) at {best.prediction.peak_bytes / GIB:.1f} GiB, under the "
            f"{plan.usable_bytes / GIB:.1f} GiB but inside the {plan.margin_bytes / GIB:.1f} GiB margin "
            f"({BUDGET_MARGIN_WORDS}: driver, allocator and data differences), so it may run out of memory: "
            f"{command(plan, best, base)}")


def sources(plan: Plan) -> list[str]:
    """Where the top row's figures come from: one line each."""
    if not plan.rows:
        return []
    p = plan.rows[0].prediction
    return [f"memory: {p.memory_source}", f"speed: {p.speed_source}"]

