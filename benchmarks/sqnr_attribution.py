"""Where does INT8 error enter? Per-tensor attribution on the fake-quantized torch model.

    ./bazelw run //benchmarks:sqnr_attribution -- \
        --models=gru_a,lstm_a,rnn_tanh_a --decompositions=ours,executorch --num_inputs=6 \
        --out=docs/results/sqnr_attribution.json

The PT2E-converted GraphModule (quantize/dequantize around every value, weights as int8
constants with a dequantize) run in torch reproduces the TOSA reference model's SQNR within a
few tenths of a dB (gru_a: 47.52 both), in seconds instead of minutes of lowering. Every
activation quantize is a lossy rounding unless it re-quantizes its input with the same
parameters (a slice or view after an already quantized value). The lossy ones are grouped by
*role*: the op that computed the value and the ops that consume it (e.g. `add>sigmoid` is
a gate pre-activation; every timestep's copy is one role). For every role two figures:

  only:  SQNR with just that role quantized (everything else float, weights included):
         the noise it alone injects, propagated to the output;
  float: SQNR with everything quantized but that role: what removing it would gain.

Plus `weights only` (activations float), `activations only` (weights float) and the
program I/O + weights ceiling (what ExecuTorch's flow quantizes identically). One input's 16
outputs make a noisy figure (+-3 dB across inputs), so noise and signal are summed over
--num_inputs inputs (input 0 is the benchmark's; each calibrates its own quantization, as the
benchmark does); the benchmark input's own figure is printed in parentheses.
"""

from __future__ import annotations

import collections
import copy
import json
import pathlib
import sys

from absl import app, flags

from recurrent_lowering.backends.executorch_arm.exported import as_module
from recurrent_lowering.backends.executorch_arm.loop.op import run_graph
from recurrent_lowering.benchmarks import caller_directory

FLAGS = flags.FLAGS
flags.DEFINE_list("models", ["gru_a", "lstm_a", "rnn_tanh_a"], "benchmark models")
flags.DEFINE_list("decompositions", ["ours", "executorch"], "ours and/or executorch")
flags.DEFINE_string("target", "ethos-u55-128", "compile spec the quantizer is made for")
flags.DEFINE_string("out", "/tmp/sqnr_attribution.json", "JSON results")
flags.DEFINE_integer("num_inputs", 6, "inputs pooled (0: the benchmark's; k: seed 1000+k)")

_Q = "quantize_per_tensor"
_DQ = "dequantize_per_tensor"
_DQ_CH = "dequantize_per_channel"
_Q_CH = "quantize_per_channel"
_MOVES = ("slice", "view", "permute", "reshape", "squeeze", "unsqueeze", "clone", "cat", "select")
_MOVES = _MOVES + tuple(m + "_copy" for m in _MOVES)


def _name(node) -> str:
    return str(getattr(node.target, "__name__", node.target)).split(".")[0]


def _is(node, what: str) -> bool:
    return node.op == "call_function" and _name(node) == what


def _consumers(node) -> list:
    """Compute ops reading `node`'s value (through q/dq and data movement)."""
    out = []
    for u in node.users:
        if u.op == "output":
            out.append("output")
        elif _is(u, _Q) or _is(u, _DQ) or _name(u) in _MOVES:
            out.extend(_consumers(u))
        else:
            out.append(_name(u))
    return out


def _origins(q) -> list:
    """The quantizes that did the rounding behind q: q itself if q rounds; for a
    same-parameter re-quantize (after a slice, view or concat of quantized values) the
    quantizes behind its input(s)."""
    prev = q.args[0]
    while prev.op == "call_function" and _name(prev) in _MOVES and _name(prev) != "cat":
        prev = prev.args[0]
    parts = prev.args[0] if prev.op == "call_function" and _name(prev) == "cat" else [prev]
    if all(_is(p, _DQ) and tuple(p.args[1:3]) == tuple(q.args[1:3]) for p in parts):
        return [o for p in parts for o in _origins(p.args[0])]
    return [q]


def lossy_quantizes(gm) -> dict:
    """Activation quantize nodes that round -> the same-parameter re-quantizes that follow
    them (bypassing the rounding must bypass those too, or they round again)."""
    lossy: dict = {}
    for n in gm.graph.nodes:
        if _is(n, _Q):
            for o in _origins(n):
                lossy.setdefault(o, []).append(n)
    return lossy


def role(q) -> str:
    src = q.args[0]
    while src.op == "call_function" and _name(src) in _MOVES:
        src = src.args[0]
        if isinstance(src, (list, tuple)):
            src = src[0]
    kind = src.name if src.op == "placeholder" else _name(src)
    users = sorted(set(_consumers(q)))
    return f"{kind}>{'|'.join(users)}"


def bypass(gm, keep_quantized):
    """A copy of gm where only the quantizes named in `keep_quantized` round."""
    gm = copy.deepcopy(gm)
    for n in list(gm.graph.nodes):
        if (_is(n, _Q) or _is(n, _Q_CH)) and n.name not in keep_quantized:
            for dq in list(n.users):
                if _is(dq, _DQ) or _is(dq, _DQ_CH):
                    dq.replace_all_uses_with(n.args[0])
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return gm


def weight_quantizes(gm) -> dict:
    """weight_role -> the per-channel weight quantize nodes of that role."""
    out = collections.defaultdict(list)
    for n in gm.graph.nodes:
        if _is(n, _Q_CH):
            out[weight_role(n)].append(n.name)
    return out


def weight_role(q) -> str:
    """A weight or bias quantize (per channel): named by its shape and integer type."""
    return f"weight{list(q.args[0].meta['val'].shape)}:{str(q.args[-1]).split('.')[-1]}"


def attribute(gm, inputs, reference) -> dict:
    """Noise and signal energies (sums of squares at the output) for one quantized model on
    its calibration input: keys all, weights_only, activations_only, io_only,
    floor_io_and_weights, and per role only/float."""
    import numpy as np
    import torch

    signal = float(np.sum(np.asarray(reference, np.float64) ** 2))

    def noise(keep):
        with torch.no_grad():
            out = run_graph(bypass(gm, keep), *inputs, record=False)
            out = out.numpy().astype(np.float64)
        return float(np.sum((out - reference) ** 2))

    nodes = {n.name: n for n in gm.graph.nodes}
    roles = collections.defaultdict(list)
    for q, chain in lossy_quantizes(gm).items():
        roles[role(q)].extend(n.name for n in chain)
    weights = collections.defaultdict(list)
    for n in gm.graph.nodes:
        if _is(n, _Q_CH):
            weights[weight_role(n)].append(n.name)
    acts = {n for names in roles.values() for n in names}
    every_weight = {n for names in weights.values() for n in names}
    # the program's input and output quantization, as ExecuTorch's: not ours to change
    io = {n for r, names in roles.items() for n in names if _io_role(r)}
    result = {
        "signal": signal,
        "all": noise(acts | every_weight),
        "weights_only": noise(every_weight),
        "activations_only": noise(acts),
        "io_only": noise(io),
        "floor_io_and_weights": noise(io | every_weight),
        "roles": {},
    }
    for r, names in sorted({**roles, **weights}.items()):
        result["roles"][r] = {
            "count": len(names),
            "scales": sorted({round(float(nodes[n].args[1]), 6) for n in names if n in acts}),
            "only": noise(set(names)),
            "float": noise((acts | every_weight) - set(names)),
        }
    return result


def pooled(results: list) -> dict:
    """SQNR in dB of each figure with signal and noise summed over inputs (results[0] is the
    benchmark input's own figure under "input0")."""
    import math

    def db(sig, noi):
        return math.inf if noi == 0 else 10 * math.log10(sig / noi)

    sig = sum(r["signal"] for r in results)
    keys = ("all", "weights_only", "activations_only", "io_only", "floor_io_and_weights")
    out = {k: db(sig, sum(r[k] for r in results)) for k in keys}
    out["input0"] = {k: db(results[0]["signal"], results[0][k]) for k in keys}
    out["roles"] = {}
    for name in results[0]["roles"]:
        rs = [r["roles"].get(name) for r in results]
        if any(x is None for x in rs):
            continue
        out["roles"][name] = {
            "count": rs[0]["count"],
            "scales": rs[0]["scales"],
            "only": db(sig, sum(x["only"] for x in rs)),
            "float": db(sig, sum(x["float"] for x in rs)),
            "only_input0": db(results[0]["signal"], rs[0]["only"]),
        }
    return out


def _io_role(r: str) -> bool:
    kind, users = r.split(">", 1)
    return users == "output" or kind in _PROGRAM_INPUTS


_PROGRAM_INPUTS = ("x", "h0")


def quantize(module, inputs, compile_spec, quantizer_factory):
    # quantizer_factory(compile_spec) -> a quantizer: `quantizer_for(decomposition)`
    """flow.quantize, but weights keep their float value and a quantize (fold_quantize=False),
    so weights can be left in float too."""
    import torch
    from executorch.backends.arm.quantizer import arm_quantizer
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    gm = as_module(torch.export.export(module, inputs))
    quantizer = quantizer_factory(compile_spec)
    quantizer.set_global(arm_quantizer.get_symmetric_quantization_config(is_per_channel=True))
    prepared = prepare_pt2e(gm, quantizer)
    run_graph(prepared, *inputs)
    return convert_pt2e(prepared, fold_quantize=False)


def quantizer_for(decomposition: str, target: str):
    """A quantizer factory: ours for `target`, or ExecuTorch's own."""
    from recurrent_lowering.backends.executorch_arm.compat import factory
    from recurrent_lowering.backends.executorch_arm.plan import ArmPlan
    from recurrent_lowering.backends.executorch_arm.quantization import quantizer

    if decomposition == "executorch":
        return factory.executorch_quantizer
    return lambda spec: quantizer.create(spec, ArmPlan(target))


def inputs_for(model: str, k: int):
    """(module, inputs): input 0 is the benchmark's own; input k > 0 is drawn from seed 1000+k."""
    import torch

    from recurrent_lowering.examples import models

    module, inputs = models.build(model)
    if k:
        g = torch.Generator().manual_seed(1000 + k)
        inputs = tuple(torch.randn(t.shape, generator=g) for t in inputs)
    return module, inputs


def run(model: str, decomposition: str, target: str, num_inputs: int, quantizer_factory=None):
    """Attribution pooled over `num_inputs` inputs, each calibrating its own quantization (the
    benchmark's protocol: calibrate on the input measured)."""
    import torch

    from recurrent_lowering.backends.executorch_arm import flow

    ethos = target.startswith("ethos-u")
    spec = flow.compile_spec(
        target,
        pathlib.Path("/tmp/sqnr_attribution_art"),
        "Ethos_U55_High_End_Embedded" if ethos else None,
        "Shared_Sram" if ethos else None,
    )
    qf = quantizer_factory or quantizer_for(decomposition, target)
    results = []
    for k in range(num_inputs):
        module, inputs = inputs_for(model, k)
        gm = quantize(module, inputs, spec, qf)
        with torch.no_grad():
            reference = module(*inputs).numpy()
        results.append(attribute(gm, inputs, reference))
    return pooled(results)


def main(argv):
    del argv
    caller_directory.enter()
    results = {}
    for m in FLAGS.models:
        for d in FLAGS.decompositions:
            r = run(m, d, FLAGS.target, FLAGS.num_inputs)
            results[f"{m}/{d}"] = r
            print(
                f"== {m} {d} (dB pooled over {FLAGS.num_inputs} inputs; benchmark input):"
                f" all {r['all']:.2f} ({r['input0']['all']:.2f}); only weights"
                f" {r['weights_only']:.2f}, only activations {r['activations_only']:.2f},"
                f" only program I/O {r['io_only']:.2f}, I/O and weights"
                f" {r['floor_io_and_weights']:.2f} ({r['input0']['floor_io_and_weights']:.2f})"
            )
            for name, v in sorted(r["roles"].items(), key=lambda kv: kv[1]["only"]):
                print(
                    f"  {name:32s} x{v['count']:3d} only {v['only']:6.2f} ({v['only_input0']:6.2f})"
                    f"  float {v['float']:6.2f}"
                )
            sys.stdout.flush()
            pathlib.Path(FLAGS.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    app.run(main)
