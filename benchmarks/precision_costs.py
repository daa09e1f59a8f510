"""Fit `--quantization auto`'s cost model (executorch_arm/precision/cost_model.py) to Vela.

Lowers crnn (examples/models.py: convolutions, a GRU, a head) for each target three ways,
all int8, all int16 and int16 recurrent layers with an int8 rest, and reads Vela's
per-layer tables and summaries:

  mac[bits]     NPU cycles per MAC of the products Vela finds compute-bound (NPU cycles
                above every memory's access cycles) in the all-int8 / all-int16 table;
  vector_mac    cycles per MAC of the recurrent steps' products with R (a matrix times one
                vector: bandwidth-bound on U55, at a low MAC rate on U85), per precision;
  weight_byte   access cycles per byte of traffic in the memory the weights live in
                (off-chip flash or DRAM if used, else SRAM), all-int8 summary;
  activation16  the CLAMPs an int16 program keeps apart (int8 fuses them into the product
                before), per element of the model's ReLUs;
  rescale       cycles per element of the RESCALEs between int8 and int16 regions;
  gate_element  what the products leave of all-int8's cycles, per element of the
                recurrent steps' gate arithmetic (the same in int16: Vela's Add/Mul rows).

  ./bazelw run //benchmarks:precision_costs -- \\
      --out backends/executorch_arm/precision/costs.json
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import tempfile

from recurrent_lowering.benchmarks import caller_directory

PRODUCTS = {"Conv2D", "DepthwiseConv2D", "FullyConnected", "MatMul"}
MEMORIES = ("SRAM AC", "DRAM AC", "OnFlash AC", "OffFlash AC")
VARIANTS = {"int8": ("int8", None), "int16": ("int16", None), "int16_recurrent": ("int8", "int16")}


def _lower(model: str, target: str, variant: str, out: pathlib.Path):
    from recurrent_lowering.backends.executorch_arm import flow
    from recurrent_lowering.backends.executorch_arm.plan import ArmPlan
    from recurrent_lowering.examples import models

    module, inputs = models.build(model)
    rest, recurrent = VARIANTS[variant]
    plan = ArmPlan(target, activations=rest, recurrent_activations=recurrent)
    return flow.lower_plan(module, inputs, plan, artifact_dir=out).vela


def _per(rows, kind: str, cycles: str = "Op Cycles") -> float:
    chosen = [r for r in rows if r["Original Operator"] == kind and int(r["MAC Count"]) > 0]
    elements = sum(int(r["MAC Count"]) for r in chosen)  # elements, for elementwise rows
    return sum(float(r[cycles]) for r in chosen) / elements if elements else 0.0


def _mac(rows) -> float:
    bound = [
        r
        for r in rows
        if r["Original Operator"] in PRODUCTS
        and int(r["MAC Count"]) > 0
        and float(r["NPU"]) >= max(float(r[m]) for m in MEMORIES)
    ]
    return sum(float(r["NPU"]) for r in bound) / sum(int(r["MAC Count"]) for r in bound)


def _vector_mac(rows, step_macs: set) -> float:
    """Cycles per MAC of the recurrent steps' products (rows with a step's MAC count)."""
    steps = [
        r for r in rows if r["Original Operator"] in PRODUCTS and int(r["MAC Count"]) in step_macs
    ]
    return sum(float(r["Op Cycles"]) for r in steps) / sum(int(r["MAC Count"]) for r in steps)


def _weight_byte(summary) -> float:
    kinds = summary.cycles_by_kind
    for memory, traffic in (
        ("off_chip_flash", summary.off_chip_flash_traffic_bytes),
        ("dram", summary.dram_traffic_bytes),
        ("sram", summary.sram_traffic_bytes),
    ):
        if traffic:
            return kinds[f"cycles_{memory}_access"] / traffic
    raise ValueError("Vela reports no memory traffic")


def _features(model: str):
    import torch

    from recurrent_lowering.backends.executorch_arm.precision import cost_model
    from recurrent_lowering.examples import models

    module, inputs = models.build(model)
    return cost_model.features(torch.export.export(module, inputs))


def fit(model: str, target: str, work: pathlib.Path) -> dict:
    from recurrent_lowering.backends.executorch_arm.precision import cost_model

    results = {v: _lower(model, target, v, work / f"{target}_{v}") for v in VARIANTS}
    rows = {v: [op.raw for op in r.ops] for v, r in results.items()}
    f = _features(model)
    clamps = sum(float(r["Op Cycles"]) for r in rows["int16"] if r["Original Operator"] == "Clamp")
    step_macs = {p.macs for p in f.recurrent if p.vector}
    costs = {
        "mac": {"int8": _mac(rows["int8"]), "int16": _mac(rows["int16"])},
        "vector_mac": {b: _vector_mac(rows[b], step_macs) for b in ("int8", "int16")},
        "weight_byte": _weight_byte(results["int8"].summary),
        "activation16": clamps / f.activation_elems if f.activation_elems else 0.0,
        "rescale": _per(rows["int16_recurrent"], "Rescale"),
        "gate_element": 0.0,
    }
    # What products leave of all-int8's cycles, per element of the steps' gate arithmetic.
    products = cost_model.estimate(f, "int8", "int8", costs)
    gates = sum(p.gate_elems for p in f.recurrent)
    costs["gate_element"] = max(0.0, results["int8"].summary.cycles - products) / gates
    costs.update(fitted_on=model, vela_cycles={v: r.summary.cycles for v, r in results.items()})
    return costs


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="the JSON the cost model reads")
    parser.add_argument("--targets", default="ethos-u55-128,ethos-u65-256,ethos-u85-256")
    parser.add_argument("--model", default="crnn")
    args = parser.parse_args(argv)
    caller_directory.enter()
    out = pathlib.Path(args.out)
    with tempfile.TemporaryDirectory() as tmp:
        targets = {t: fit(args.model, t, pathlib.Path(tmp)) for t in args.targets.split(",")}
    command = "./bazelw run //benchmarks:precision_costs -- --out " + args.out
    document = {
        "about": "int16 cost model constants fitted against Vela 5.1.0 (default system "
        "configs); see benchmarks/precision_costs.py",
        "command": command,
        "targets": targets,
    }
    out.write_text(json.dumps(document, indent=1, sort_keys=True) + "\n")
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
