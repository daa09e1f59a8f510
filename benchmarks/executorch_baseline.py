"""Measure ExecuTorch 1.5.1's own Arm lowering of a benchmark model (the baseline we compare to).

    ./bazelw run //benchmarks:executorch_baseline -- gru_a TOSA-1.0+INT ethos-u55-128 \
        --out /tmp/baseline

Prints one JSON line per target: stage times, edge nodes, TOSA ops, numerics vs fp32 eager and,
for Ethos-U targets, Vela's estimates.
"""

from __future__ import annotations

import argparse
import json
import pathlib

from recurrent_lowering.backends.executorch_arm import flow
from recurrent_lowering.benchmarks import caller_directory
from recurrent_lowering.examples import models
from recurrent_lowering.runtime import arm_numerics


def measure(name: str, target: str, out_dir: pathlib.Path) -> dict:
    module, inputs = models.build(name)
    result = flow.lower(
        module,
        inputs,
        target,
        artifact_dir=out_dir / f"{name}_{target}",
        decomposition="executorch",
    )
    row = {
        "model": name,
        "target": target,
        "times_s": {k: round(v, 2) for k, v in result.times.items()},
        "edge_nodes": result.edge_nodes,
        "cpu_nodes": result.cpu_nodes,
        "delegates": result.num_delegates,
        "tosa_ops": result.tosa_ops,
        "tosa_compute_ops": result.tosa_compute_ops,
        "pte_bytes": len(result.pte),
    }
    try:
        numerics = arm_numerics.check(result, module, inputs)
        row.update(max_abs_err=numerics.max_abs_err, sqnr_db=round(numerics.sqnr_db, 2))
    except arm_numerics.NumericsError as e:
        row["numerics_error"] = str(e)
    if result.vela is not None:
        s = result.vela.summary
        row["vela"] = {
            "system_config": s.system_config,
            "memory_mode": s.memory_mode,
            "cycles": s.cycles,
            "inference_time_s": s.inference_time_s,
            "mac_utilisation": s.mac_utilisation,
            "sram_used_bytes": s.sram_used_bytes,
            "off_chip_flash_used_bytes": s.off_chip_flash_used_bytes,
            "nn_macs": s.nn_macs,
        }
    return row


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model", choices=sorted(models.MODELS))
    parser.add_argument("targets", nargs="+", help="TOSA-1.0+FP, TOSA-1.0+INT, ethos-u55-128, ...")
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("/tmp/et_baseline"))
    args = parser.parse_args(argv)
    caller_directory.enter()
    for target in args.targets:
        print(json.dumps(measure(args.model, target, args.out)), flush=True)


if __name__ == "__main__":
    main()
