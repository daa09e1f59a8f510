"""The lowering report: stable JSON keys (documented in the README) and a readable summary.

Keys are nested objects; the README names them with dots (`vela.cycles` is
report["vela"]["cycles"]). A key whose figure does not apply to the target is null.
"""

from __future__ import annotations

import json
from typing import Any


def empty(target: str, model: str) -> dict[str, Any]:
    return {
        "model": model,
        "target": target,
        "output": None,
        "artifacts": {},
        "ops": {"delegated": None, "cpu": None, "cpu_reasons": {}, "recurrent_layers": []},
        "vela": {
            "cycles": None,
            "inference_time_s": None,
            "sram_bytes": None,
            "flash_bytes": None,
            "dram_bytes": None,
            "system_config": None,
            "memory_mode": None,
        },
        "quantization": {"activations": None, "recurrent_weight_bits": None},
        "numerics": {
            "reference": None,
            "inputs": None,
            "input_shapes": None,
            "max_abs_err": None,
            "sqnr_db": None,
            "plot": None,
        },
        "time": {"total_s": None, "stages": {}},
        "log": None,
        "warnings": [],
    }


def to_json(report: dict[str, Any]) -> str:
    return json.dumps(report, indent=2, sort_keys=False) + "\n"


def _fmt(value: Any, unit: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}{unit}"
    if isinstance(value, int):
        return f"{value:,}{unit}"
    return f"{value}{unit}"


def _per_output(num: dict) -> str:
    figures = num.get("sqnr_db_per_output")
    if not figures:
        return ""
    names = num.get("outputs") or [None] * len(figures)
    equal = num.get("equal_per_output")
    if equal is None:
        each = [f"{name} {_fmt(f)}" if name else _fmt(f) for name, f in zip(names, figures)]
        return " (per output: " + ", ".join(each) + " dB)"
    each = [  # an integer output by its share of equal elements, the others in dB
        f"{name or k}: {_fmt(f, ' dB') if e is None else f'equal on {100 * e:.4g}%'}"
        for k, (name, f, e) in enumerate(zip(names, figures, equal))
    ]
    return " (per output: " + ", ".join(each) + ")"


def _inputs(num: dict) -> str:
    """Where the numerics inputs came from, with how many samples and whether streamed."""
    samples = num.get("samples")
    text = str(num["inputs"])
    if samples and not samples["calibration"] and samples["evaluation"] > 1:
        text += f", {samples['evaluation']} samples checked"
    elif samples and (samples["calibration"] > 1 or samples["evaluation"] > 1):
        text += f", {samples['calibration']} samples calibrating, {samples['evaluation']} checked"
    if num.get("stream"):
        text += ", streamed with the states fed back"
    return text


def summary(report: dict[str, Any]) -> str:
    """A Markdown summary that reads well in a terminal too."""
    vela, ops, num = report["vela"], report["ops"], report["numerics"]
    lines = [
        f"## {report['model']} -> {report['target']}",
        "",
        f"output: {report['output']}",
    ]
    if report.get("log"):
        lines.append(f"log of other libraries' messages: {report['log']}")
    lines += [
        "",
        "| what | value |",
        "|---|---|",
        f"| ops delegated / on CPU | {_fmt(ops['delegated'])} / {_fmt(ops['cpu'])} |",
    ]
    if vela["cycles"] is not None:
        ms = vela["inference_time_s"] * 1e3 if vela["inference_time_s"] is not None else None
        lines += [
            f"| NPU cycles (Vela estimate) | {_fmt(vela['cycles'])} |",
            f"| inference time (Vela estimate) | {_fmt(ms, ' ms')} |",
            f"| SRAM | {_fmt(vela['sram_bytes'], ' B')} |",
            f"| flash | {_fmt(vela['flash_bytes'], ' B')} |",
        ]
        if vela.get("dram_bytes"):
            lines.append(f"| DRAM | {_fmt(vela['dram_bytes'], ' B')} |")
        lines += [
            f"| Vela system config / memory mode | {vela['system_config']} / "
            f"{vela['memory_mode']} |",
        ]
    quant = report["quantization"]
    if quant["activations"] is not None:
        lines.append(
            f"| quantization | {_activations(quant)}, recurrent weights "
            f"{quant['recurrent_weight_bits']}-bit |"
        )
    if num["max_abs_err"] is not None:
        vs = num.get("reference_precision", "fp32")  # fp16: a half-precision model's own
        lines += [
            f"| max abs error vs {vs} ({num['reference']}; inputs: {_inputs(num)}) | "
            f"{_fmt(num['max_abs_err'])} |",
            f"| SQNR vs {vs} | {_fmt(num['sqnr_db'], ' dB')}{_per_output(num)} |",
        ]
    hardware = num.get("hardware")
    if hardware and hardware["assumes"]:
        lines.append(
            "| on the NPU | this SQNR if " + "; ".join(hardware["assumes"]) + " (no public "
            "Arm document states it; docs/precision.md) |"
        )
    lines.append(f"| total time | {_fmt(report['time']['total_s'], ' s')} |")
    for reason, count in sorted(ops["cpu_reasons"].items()):
        lines.append(f"- on CPU ({count}): {reason}")
    lines += [f"- warning: {w}" for w in report["warnings"]]
    return "\n".join(lines) + "\n"


def _activations(quant: dict) -> str:
    """ "auto: recurrent layers int16, rest int8 (int8: ~N cycles)", or the explicit choice."""
    auto = quant.get("auto")
    if quant["activations"] != "auto" or auto is None:
        return quant["activations"]
    if "regions" not in auto:
        return f"auto: int8 ({auto['why']})"
    if "fallback" in auto:
        return f"auto: int8 ({auto['fallback']})"
    regions = ", ".join(f"{region} {bits}" for region, bits in auto["regions"].items())
    int8, estimate = auto.get("int8_cycles"), auto.get("int8_cycles_estimate")
    if int8:  # int8 was lowered too (auto's refit)
        text = f"auto: {regions} (int8: {int8:,} cycles measured)"
    else:
        text = f"auto: {regions}" + (f" (int8: ~{estimate:,} cycles)" if estimate else "")
    predicted = auto.get("predicted_sqnr_db", {}).get(auto["choice"])
    if predicted:
        text += f", predicted worst output {min(predicted):.1f} dB (target {auto['min_sqnr']:g})"
    measured = auto.get("measured_sqnr_db", {}).get(auto["choice"])
    if measured:
        text += f", verified on the TOSA reference model: {min(measured):.1f} dB"
    return text
