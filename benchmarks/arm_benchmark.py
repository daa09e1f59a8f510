"""Our Arm adapter vs ExecuTorch 1.5.1's own recurrent passes, side by side, per model and target.

    ./bazelw run //benchmarks:arm_benchmark -- --models=gru_a,lstm_a,rnn_tanh_a \
        --out=docs/results/arm_benchmark.md --json=/tmp/arm_bench.jsonl

Every (model, target, decomposition, variant) is lowered in its own subprocess (lowering
times are not skewed by a previous lowering's garbage, and memory is returned), and its row
is appended to --json as soon as it is measured; the Markdown is rewritten after every row
from everything in --json, so a partial run is useful and a re-run skips measured rows
(--noreuse to measure again). Vela cycles are deterministic; lowering seconds are wall time
on whatever machine this runs on (the document records `uptime` load averages).

Variants beyond ExecuTorch's defaults (user choices, --variants): `sram_only` (U55 with
memory mode Sram_Only: constants in SRAM), `int16` (int16 activations, int8 weights; U85
and TOSA INT), `int16_state` and `rw4` / `rw6` (recurrent weights at 4 / 6 bits).
`--non_recurrent` lowers a small MLP and conv net with and without our passes installed
(they must cost nothing there).
"""

from __future__ import annotations

import datetime
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

from absl import app, flags

from recurrent_lowering.benchmarks import caller_directory
from recurrent_lowering.runtime import arm_numerics

FLAGS = flags.FLAGS
flags.DEFINE_list("models", ["gru_a", "lstm_a", "rnn_tanh_a", "bigru2", "big_gru"], "models")
flags.DEFINE_list(
    "targets", ["ethos-u55-128", "ethos-u85-256", "TOSA-1.0+INT"], "TOSA or Ethos-U targets"
)
flags.DEFINE_list(
    "decompositions",
    ["ours", "executorch"],
    "ours (auto: unrolled up to 8 steps, loop form beyond), ours-unrolled, ours-loop (one "
    "loop node per layer direction) and/or executorch",
)
flags.DEFINE_list(
    "sweep_t", [], "lowering-time sweep: gru_a at these T (e.g. 25,50,100,200), ethos-u55-128"
)
flags.DEFINE_list(
    "variants",
    [],
    "extra rows: sram_only (U55), int16 (U85, TOSA INT), int16_state (U55, with ours-loop), "
    "rw4 (U55, U85) and rw6 (U55): recurrent weights at 4 / 6 bits (ours only)",
)
flags.DEFINE_bool("non_recurrent", False, "time a small MLP and conv net with/without our passes")
flags.DEFINE_string("out", "docs/results/arm_benchmark.md", "Markdown output")
flags.DEFINE_string("json", "/tmp/arm_benchmark.jsonl", "JSON lines, one row per measurement")
flags.DEFINE_string("work_dir", "/tmp/arm_benchmark", "artifacts (TOSA, Vela output) per row")
flags.DEFINE_bool("reuse", True, "skip rows already in --json")
flags.DEFINE_string("one", None, "internal: measure one 'model,target,decomposition,variant'")
flags.DEFINE_integer("repeats", 3, "non-recurrent timing repeats (median reported)")

# The acceptance targets: cycles / ExecuTorch's on the same target and default config.
CYCLE_TARGETS = {
    "ethos-u55-128": {
        "gru_a": 0.70,
        "lstm_a": 0.72,
        "rnn_tanh_a": 0.72,
        "bigru2": 0.50,
        "big_gru": 0.52,
    },
    "ethos-u85-256": {m: 0.40 for m in ("gru_a", "lstm_a", "rnn_tanh_a", "bigru2", "big_gru")},
}
# Estimated floors for a decomposition that reads int8 R every step (default configs): the
# cycles of streaming R from flash (U55) or of the MATMUL form's products (U85), over
# ExecuTorch's cycles. Arithmetic, not measurements (docs/results/arm_benchmark.md).
ESTIMATED_FLOORS = {
    ("ethos-u55-128", "gru_a"): "~0.64",
    ("ethos-u55-128", "big_gru"): "~0.49",
    ("ethos-u85-256", "gru_a"): "~0.35",
}
# ExecuTorch 1.5.1's cycles per model and target, measured with its own Arm flow at the default
# system configs (`bazel run //benchmarks:executorch_baseline -- MODEL TARGET...`): used (†)
# where this harness has no ExecuTorch row of its own, and checked where it has one.
BASELINE_ET_CYCLES = {
    ("gru_a", "ethos-u55-128"): 1292124,
    ("gru_a", "ethos-u85-256"): 110873,
    ("lstm_a", "ethos-u55-128"): 1753724,
    ("lstm_a", "ethos-u85-256"): 158289,
    ("rnn_tanh_a", "ethos-u55-128"): 442220,
    ("rnn_tanh_a", "ethos-u85-256"): 44309,
    ("bigru2", "ethos-u55-128"): 15254788,
    ("bigru2", "ethos-u85-256"): 1268830,
    ("big_gru", "ethos-u55-128"): 41127110,
    ("big_gru", "ethos-u85-256"): 3089977,
}


def _non_recurrent_models():
    import torch
    from torch import nn

    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 32), nn.Sigmoid())
    conv = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 16, 3, padding=1, stride=2),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(16 * 8 * 8, 10),
    )
    return {
        "mlp": (mlp.eval(), (torch.randn(1, 64),)),
        "convnet": (conv.eval(), (torch.randn(1, 3, 16, 16),)),
    }


# decomposition column -> flow.lower keyword arguments
DECOMPOSITIONS = {
    "ours": dict(decomposition="ours", emission="auto"),
    "ours-unrolled": dict(decomposition="ours", emission="unrolled"),
    "ours-loop": dict(decomposition="ours", emission="loop"),
    "executorch": dict(decomposition="executorch"),
}


def _build(model: str):
    """(module, inputs) for a benchmark model name; "gru_a@T=50" is gru_a with T = 50."""
    import dataclasses

    from recurrent_lowering.examples import models

    if model in ("mlp", "convnet"):
        return _non_recurrent_models()[model]
    name, _, seq_len = model.partition("@T=")
    if seq_len:
        return dataclasses.replace(models.MODELS[name], seq_len=int(seq_len)).build()
    return models.build(name)


def _warm_up(target: str, decomposition: str) -> None:
    """Lower tiny_gru once, so one-time costs (imports, op registration) that the first
    lowering in a process pays stay out of the timed lowering, for every column alike."""
    import tempfile

    from recurrent_lowering.backends.executorch_arm import flow
    from recurrent_lowering.examples import models

    module, inputs = models.build("tiny_gru")
    with tempfile.TemporaryDirectory() as tmp:
        flow.lower(
            module,
            inputs,
            target,
            artifact_dir=tmp,
            run_vela=False,
            **DECOMPOSITIONS[decomposition],
        )


def measure(model: str, target: str, decomposition: str, variant: str, work: pathlib.Path):
    """One lowering with its figures, as a JSON-able dict."""
    from recurrent_lowering.backends.executorch_arm import flow

    module, inputs = _build(model)
    _warm_up(target, decomposition)
    kwargs = {"quantization": "int8"}  # every row but int16's: auto has its own benchmark
    if variant == "sram_only":
        kwargs["memory_mode"] = "Sram_Only"
    elif variant == "int16":
        kwargs["quantization"] = "int16"
    elif variant == "int16_state":  # int8 program, loop-form steps in int16
        kwargs["quantization"] = "int16_state"
    elif variant in ("rw4", "rw6"):  # recurrent weights at 4 / 6 bits (CONV form)
        kwargs["recurrent_weight_bits"] = int(variant[2:])
    elif variant != "default":
        raise ValueError(f"unknown variant {variant!r}")
    out = work / f"{model}_{target}_{decomposition}_{variant}"
    t0, c0 = time.perf_counter(), time.process_time()
    result = flow.lower(
        module, inputs, target, artifact_dir=out, **DECOMPOSITIONS[decomposition], **kwargs
    )
    row = {
        "model": model,
        "target": target,
        "decomposition": decomposition,
        "variant": variant,
        "times_s": {k: round(v, 2) for k, v in result.times.items()},
        "total_s": round(time.perf_counter() - t0, 2),
        # CPU seconds of this process for the whole flow.lower (Vela's subprocess excluded):
        # less disturbed than wall time by other work on a shared machine
        "cpu_s": round(time.process_time() - c0, 2),
        "edge_nodes": result.edge_nodes,
        "cpu_nodes": result.cpu_nodes,
        "delegates": result.num_delegates,
        "tosa_ops": result.tosa_ops,
        "tosa_compute_ops": result.tosa_compute_ops,
        "load": os.getloadavg()[0],
    }
    try:
        numerics = arm_numerics.check(result, module, inputs)
        row.update(max_abs_err=numerics.max_abs_err, sqnr_db=round(numerics.sqnr_db, 2))
    except arm_numerics.NumericsError as e:
        row["numerics_error"] = str(e)
    if result.vela is not None:
        s = result.vela.summary
        by_op: dict = {}
        for op in result.vela.ops:
            by_op[op.npu_op] = by_op.get(op.npu_op, 0) + op.cycles
        row["vela"] = {
            "memory_mode": s.memory_mode,
            "cycles": s.cycles,
            "inference_time_s": s.inference_time_s,
            "sram_used_bytes": s.sram_used_bytes,
            "flash_used_bytes": s.off_chip_flash_used_bytes + s.on_chip_flash_used_bytes,
            "mac_utilisation": s.mac_utilisation,
            "cycles_by_npu_op": by_op,
        }
    return row


# --- running ----------------------------------------------------------------------------------


def _key(row: dict) -> tuple:
    return (row["model"], row["target"], row["decomposition"], row["variant"])


def _load(path: pathlib.Path) -> dict:
    rows = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                rows[_key(row)] = row
    return rows


def _run_one(key: tuple, json_path: pathlib.Path) -> dict:
    cmd = [sys.executable, "-m", "recurrent_lowering.benchmarks.arm_benchmark"]
    cmd += [f"--one={','.join(key)}", f"--work_dir={FLAGS.work_dir}"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        row = dict(zip(("model", "target", "decomposition", "variant"), key))
        row["error"] = (proc.stderr or proc.stdout).strip().splitlines()[-1:]
        row["total_s"] = round(time.perf_counter() - t0, 2)
    else:
        row = json.loads(lines[-1])
    with json_path.open("a") as f:
        f.write(json.dumps(row) + "\n")
    return row


def _plan() -> list[tuple]:
    keys = []
    for model in FLAGS.models:
        for target in FLAGS.targets:
            for dec in FLAGS.decompositions:
                keys.append((model, target, dec, "default"))
        for variant in FLAGS.variants:
            targets = {
                "sram_only": ["ethos-u55-128"],
                "int16": ["ethos-u85-256"],
                "int16_state": ["ethos-u55-128"],
                "rw4": ["ethos-u55-128", "ethos-u85-256"],
                "rw6": ["ethos-u55-128"],
            }[variant]
            for target in targets:
                for dec in FLAGS.decompositions:
                    keys.append((model, target, dec, variant))
    for t in FLAGS.sweep_t:
        for dec in FLAGS.decompositions:
            keys.append((f"gru_a@T={t}", "ethos-u55-128", dec, "default"))
    if FLAGS.non_recurrent:
        for model in ("mlp", "convnet"):
            for _ in range(FLAGS.repeats):
                for dec in ("ours", "executorch"):
                    keys.append((model, "ethos-u55-128", dec, "default"))
    return keys


# --- the document -----------------------------------------------------------------------------


def _fmt_int(v) -> str:
    return "-" if v is None else f"{v:,}"


def _fmt(v, spec: str = ".1f") -> str:
    return "-" if v is None else format(v, spec)


def _cycles(row):
    return (row or {}).get("vela", {}).get("cycles")


def _lower_s(row):
    if not row or "times_s" not in row:
        return None
    t = row["times_s"]
    return t.get("quantize", 0) + t.get("export", 0) + t.get("lower", 0)


def render(rows: dict, command: str, loads: list) -> str:
    models = list(
        dict.fromkeys(k[0] for k in rows if k[0] not in ("mlp", "convnet") and "@" not in k[0])
    )
    targets = list(dict.fromkeys(k[1] for k in rows))
    out = [
        "# Our Arm adapter vs ExecuTorch 1.5.1's recurrent passes",
        "",
        "Generated by `benchmarks/arm_benchmark.py` from `arm_benchmark.jsonl` (one row per",
        "measurement); edit the prose there, or below the tables by hand. Command:",
        "",
        "```sh",
        command,
        "```",
        "",
        '- *ours*: `flow.lower(..., decomposition="ours")` (the default; what `//tools:lower` '
        "uses): recurrent_lowering's passes in ExecuTorch's slots, the recurrent product's form "
        'chosen per target (`ArmPlan.products`), `emission="auto"`: unrolled up to 8 '
        "steps per layer stack, the loop form beyond (docs/arm_loop_form.md). *ET*: ExecuTorch "
        "1.5.1's own DecomposeGru/Lstm/RnnPass.",
        "- Cycles: Vela 5.1.0 estimates, ExecuTorch's default system config and memory mode per "
        "target (U55: Ethos_U55_High_End_Embedded, Shared_Sram; U85: Ethos_U85_SYS_DRAM_Mid, "
        "Sram_Only). Deterministic.",
        "- Target: the project's target ratio (ours/ET). Floor: an estimate of what a "
        "decomposition reaches with int8 R read every step (below the tables); on U85 also "
        "*mm*, our recurrent MATMULs alone over ExecuTorch's cycles (Vela's per-op table), "
        "which no glue removal lowers.",
        "- Lowering s: quantize + export + `to_edge_transform_and_lower` wall seconds (Vela and "
        "to_executorch excluded). Noisy: a 2-core machine shared by other workers; 1-minute "
        f"load averages at the measurements: {_fmt(min(loads) if loads else None)} to "
        f"{_fmt(max(loads) if loads else None)}.",
        "- SQNR: INT8 TOSA (the row's target's dumped .tosa) on the TOSA reference model vs fp32 "
        "torch eager, same input as the calibration.",
        "",
        "| model | target | ET cycles | ours cycles | ours/ET | target | floor | "
        "lowering s ours / ET | edge nodes ours / ET | TOSA ops ours / ET | SQNR dB ours / ET |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for model in models:
        for target in targets:
            ours = rows.get((model, target, "ours", "default"))
            et = rows.get((model, target, "executorch", "default"))
            if ours is None and et is None:
                continue
            c_o, c_e = _cycles(ours), _cycles(et)
            mark = ""
            if c_e is None and (model, target) in BASELINE_ET_CYCLES:
                c_e, mark = BASELINE_ET_CYCLES[(model, target)], "†"  # not measured in this run
            ratio = f"**{c_o / c_e:.3f}**{mark}" if c_o and c_e else "-"
            goal = CYCLE_TARGETS.get(target, {}).get(model)
            err = [r.get("error") for r in (ours, et) if r and r.get("error")]
            out.append(
                f"| {model} | {target} | {_fmt_int(c_e)}{mark} | {_fmt_int(c_o)} | {ratio} | "
                f"{'<= ' + format(goal, '.2f') if goal else '-'} | "
                f"{_floor(model, target, ours, c_e)} | "
                f"{_fmt(_lower_s(ours))} / {_fmt(_lower_s(et))} | "
                f"{(ours or {}).get('edge_nodes', '-')} / {(et or {}).get('edge_nodes', '-')} | "
                f"{(ours or {}).get('tosa_ops', '-')} / {(et or {}).get('tosa_ops', '-')} | "
                f"{_fmt((ours or {}).get('sqnr_db'))} / {_fmt((et or {}).get('sqnr_db'))} |"
                + (f" error: {err}" if err else "")
            )
    out += [
        "",
        "† ExecuTorch's cycles from the baseline measurement (`BASELINE_ET_CYCLES`; "
        "`bazel run //benchmarks:executorch_baseline -- MODEL TARGET`), not by this harness; "
        "where both exist they are identical (next line).",
    ]
    check = [
        (m, t, _cycles(rows.get((m, t, "executorch", "default"))), c)
        for (m, t), c in BASELINE_ET_CYCLES.items()
        if rows.get((m, t, "executorch", "default"))
    ]
    if check:
        same = all(a == b for _, _, a, b in check)
        out += [
            "",
            f"ExecuTorch rows here vs the baseline measurement's cycles: {len(check)} rows, "
            + ("all identical." if same else f"differences: {[c for c in check if c[2] != c[3]]}"),
        ]
    loops = [
        k
        for k in rows
        if k[2] in ("ours-loop", "ours-unrolled") and "@" not in k[0] and k[3] == "default"
    ]
    if loops:
        out += [
            "",
            "## Forced form (`--emission loop` / `unrolled`)",
            "",
            "The main table's *ours* is `auto`: unrolled up to 8 steps per layer stack, the "
            "loop form beyond (docs/arm_loop_form.md), so for these models the main table is "
            "the loop form. Here the unrolled form forced, same models and targets.",
            "",
            "| model | target | form | cycles | vs ET | SQNR dB | lowering s (CPU s) | "
            "edge nodes | TOSA ops |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for key in sorted(loops):
            row = rows[key]
            c = _cycles(row)
            base = _cycles(rows.get((key[0], key[1], "executorch", "default")))
            base = base or BASELINE_ET_CYCLES.get((key[0], key[1]))
            out.append(
                f"| {key[0]} | {key[1]} | {key[2][len('ours-') :]} | {_fmt_int(c)} | "
                f"{_fmt(c / base if c and base else None, '.3f')} | {_fmt(row.get('sqnr_db'))} | "
                f"{_fmt(_lower_s(row))} ({_fmt(row.get('cpu_s'))}) | "
                f"{row.get('edge_nodes', '-')} | {row.get('tosa_ops', '-')} |"
                + (f" error: {row['error']}" if row.get("error") else "")
            )
    variants = [k for k in rows if k[3] != "default"]
    if variants:
        out += [
            "",
            "## User choices beyond the defaults",
            "",
            "| model | target | variant | decomposition | cycles | vs ET default | SRAM used | "
            "flash used | SQNR dB |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for key in sorted(variants):
            row = rows[key]
            base = _cycles(rows.get((key[0], key[1], "executorch", "default")))
            base = base or BASELINE_ET_CYCLES.get((key[0], key[1]))
            c = _cycles(row)
            vela = row.get("vela", {})
            out.append(
                f"| {key[0]} | {key[1]} | {key[3]} | {key[2]} | {_fmt_int(c)} | "
                f"{_fmt(c / base if c and base else None, '.3f')} | "
                f"{_fmt_int(vela.get('sram_used_bytes'))} B | "
                f"{_fmt_int(vela.get('flash_used_bytes'))} B | {_fmt(row.get('sqnr_db'))} |"
                + (f" error: {row['error']}" if row.get("error") else "")
            )
    sweep = sorted(
        {k[0] for k in rows if k[0].startswith("gru_a@T=")}, key=lambda m: int(m.split("=")[1])
    )
    if sweep:
        decs = [
            d
            for d in DECOMPOSITIONS
            if any((m, "ethos-u55-128", d, "default") in rows for m in sweep)
        ]
        out += [
            "",
            "## Lowering time against T (gru_a's sizes, ethos-u55-128)",
            "",
            "CPU seconds of the whole `flow.lower` (quantize, export, "
            "`to_edge_transform_and_lower`, Vela, to_executorch) in a fresh process after one "
            "warm-up lowering of tiny_gru "
            "(imports not counted); CPU time is less disturbed than wall time by other work on the "
            "machine. Wall seconds (quantize + export + lower) in brackets.",
            "",
            "| T | "
            + " | ".join(f"{d}" for d in decs)
            + " | "
            + " | ".join(f"{d} / executorch" for d in decs if d != "executorch")
            + " |",
            "|---|" + "---|" * (2 * len(decs) - ("executorch" in decs)),
        ]
        for m in sweep:
            got = {d: rows.get((m, "ethos-u55-128", d, "default")) for d in decs}
            cpu = {d: (got[d] or {}).get("cpu_s") for d in decs}
            et = cpu.get("executorch")
            ratios = [
                _fmt(cpu[d] / et if cpu[d] and et else None, ".2f")
                for d in decs
                if d != "executorch"
            ]
            cells = [f"{_fmt(cpu[d])} ({_fmt(_lower_s(got[d]))})" for d in decs]
            out.append(
                f"| {m.split('=')[1]} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |"
            )
    nonrec = [k for k in rows if k[0] in ("mlp", "convnet")]
    if nonrec:
        out += ["", "## Models without recurrent layers: our passes installed vs not", ""]
        out += [
            "CPU seconds of the whole `flow.lower` (wall seconds of `lower` for rows measured "
            "before CPU time was recorded), median over the repeats.",
            "",
        ]
        out += ["| model | lower s, ours (median) | lower s, ET (median) | difference |"]
        out += ["|---|---|---|---|"]
        for model in ("mlp", "convnet"):
            t = {
                dec: [
                    r.get("cpu_s", r["times_s"]["lower"])
                    for r in _all_rows.get((model, "ethos-u55-128", dec, "default"), [])
                    if "times_s" in r
                ]
                for dec in ("ours", "executorch")
            }
            if t["ours"] and t["executorch"]:
                a, b = statistics.median(t["ours"]), statistics.median(t["executorch"])
                out.append(
                    f"| {model} | {a:.2f} (n={len(t['ours'])}) | {b:.2f} "
                    f"(n={len(t['executorch'])}) | {a - b:+.2f} s |"
                )
    out.append("")
    return "\n".join(out)


_all_rows: dict = {}  # key -> every row measured for it (the non-recurrent repeats)


def _floor(model: str, target: str, ours, et_cycles) -> str:
    """The estimated floor, and where our program has MATMULs (the recurrent products on U85)
    their share of ExecuTorch's cycles."""
    parts = [ESTIMATED_FLOORS[(target, model)]] if (target, model) in ESTIMATED_FLOORS else []
    mm = ((ours or {}).get("vela") or {}).get("cycles_by_npu_op", {}).get("MatMul")
    if mm and et_cycles:
        parts.append(f"mm {mm / et_cycles:.3f}")
    return ", ".join(parts) or "-"


def _write(path: pathlib.Path, json_path: pathlib.Path, command: str) -> None:
    rows, loads = {}, []
    _all_rows.clear()
    for line in json_path.read_text().splitlines() if json_path.exists() else []:
        if line.strip():
            row = json.loads(line)
            rows[_key(row)] = row
            _all_rows.setdefault(_key(row), []).append(row)
            if "load" in row:
                loads.append(row["load"])
    text = render(rows, command, loads)
    marker = "<!-- measured results end -->"
    if path.exists() and marker in path.read_text():  # keep hand-written analysis below
        text += "\n" + marker + path.read_text().split(marker, 1)[1]
    path.write_text(text)


def main(argv) -> None:
    del argv
    caller_directory.enter()
    work = pathlib.Path(FLAGS.work_dir)
    if FLAGS.one:
        model, target, dec, variant = FLAGS.one.split(",")
        print(json.dumps(measure(model, target, dec, variant, work)), flush=True)
        return
    json_path = pathlib.Path(FLAGS.json)
    out = pathlib.Path(FLAGS.out)
    command = " ".join(["./bazelw run //benchmarks:arm_benchmark --"] + sys.argv[1:])
    done = _load(json_path) if FLAGS.reuse else {}
    planned = _plan()
    repeats: dict = {}
    for key in planned:
        repeats[key] = repeats.get(key, 0) + 1
        have = len([1 for r in _load_all(json_path) if _key(r) == key]) if FLAGS.reuse else 0
        if key in done and repeats[key] <= have:
            continue
        stamp = datetime.datetime.now().strftime("%H:%M:%S")
        print(f"[{stamp}] {' '.join(key)} (load {os.getloadavg()[0]:.1f})", flush=True)
        row = _run_one(key, json_path)
        cycles = _cycles(row)
        print(
            f"    cycles {cycles}, lower {_lower_s(row)} s, SQNR {row.get('sqnr_db')}"
            + (f", error {row['error']}" if row.get("error") else ""),
            flush=True,
        )
        _write(out, json_path, command)
    _write(out, json_path, command)


def _load_all(path: pathlib.Path) -> list:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def entry() -> None:
    app.run(main)


if __name__ == "__main__":
    entry()
