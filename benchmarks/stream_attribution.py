"""Where a real model's accuracy goes, on held-out speech, in seconds: its converted module
(precision/accuracy.py's simulation) against fp32 per output, closed loop for a stream.

    python -m recurrent_lowering.benchmarks.stream_attribution --model silero_vad \\
        --quantization int8 --roles --sensitivity --out OUT.json

The model and its samples are benchmarks/real_models.py's: calibration on espeak-ng's
sentences, evaluation on alsa-utils' recordings held out (speech.py). Prints per output
SQNR, the speech decisions at 0.5 of a model whose first output is a probability, and:

  --roles        per role (sqnr_attribution.role: the op that computed a value and its
                 consumers; weights by shape), everything quantized but it ("float") and
                 it alone quantized ("only"); --role R (repeatable) for these alone;
                 --only_alone: the "only" figures alone (half the simulations)
  --sensitivity  the fp32 model with Gaussian noise of a relative RMS added to its state
                 outputs (or to its first input) every frame: the closed loop's own gain on
                 noise, which no quantization can beat
  --clip_inputs  the fp32 model with each input but the states clipped to the range the
                 calibration samples span: what a quantize at that range loses on held-out
                 input louder than the calibration, before any rounding
  --sqrt_table N the fp32 model with each sqrt replaced by an N-entry linearly interpolated
                 table over [0, its largest input in calibration] (ExecuTorch's int16 sqrt:
                 513 entries), everything else float
  --tosa         also lower it (flow.lower, the same calibration) and measure the program on
                 the TOSA reference model in the same closed loop: the simulation checked
  --lut_down     with --tosa: the program also with its int16 TABLEs rounding down, as a
                 U55 whose LUT truncated its interpolation would compute them
                 (ethos_u55_int16.truncating_luts): what the figure rests on there
  --steps S      float (default): loop steps simulated in float, the main graph quantized;
                 quantized: as the lowering lowers them (loop.step.simulated), auto's
                 prediction
  --open_loop    each held-out frame from the fp32 stream's states (teacher-forced), not
                 the program's own: the error one frame adds, without the loop's gain
                 (--sensitivity measures that gain); every figure then reads so
  --float_cell   also the simulation with each LSTM loop step quantized but its cell-state
                 path (cell_path.py: c, the products and sums it enters) left float: what a
                 wider cell state would give
  --widen F      every int16 activation's range (the loop steps' too, states included)
                 F times the one its histogram search finds: whether the calibrated ranges
                 clip what the held-out stream needs (F > 1 helps) or their resolution is
                 what limits it (F > 1 hurts, about 6 dB a doubling on what it limits)
  --int16_tables SPEC[;SPEC...]
                 the simulation with ExecuTorch's int16 TABLEs emulated (int16_tables.py) on
                 the ops SPEC names: all, op names (sigmoid, tanh, reciprocal, pow: a sqrt)
                 or node names, comma-separated; one figure per SPEC
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import pathlib
import tempfile
import types

import numpy as np
import onnx
import torch

from recurrent_lowering.backends.executorch_arm import flow
from recurrent_lowering.backends.executorch_arm.exported import module_of
from recurrent_lowering.backends.executorch_arm.loop import step as loop_step
from recurrent_lowering.backends.executorch_arm.loop.op import program_of, run_graph
from recurrent_lowering.backends.executorch_arm.options import Options
from recurrent_lowering.backends.executorch_arm.precision import accuracy, candidates
from recurrent_lowering.backends.executorch_arm.quantization import quantizer as our_quantizer
from recurrent_lowering.backends.onnx.input_sizes import input_specs
from recurrent_lowering.benchmarks import (
    caller_directory,
    cell_path,
    int16_tables,
    real_models,
    speech,
    widened_ranges,
)
from recurrent_lowering.benchmarks import sqnr_attribution as sa
from recurrent_lowering.runtime import streams
from recurrent_lowering.runtime.metrics import sqnr_per_output
from recurrent_lowering.tools.lowering import calibration, model_source, onnx_route


class _Silent:
    """A progress that reports nothing (onnx_route.prepare's stages)."""

    @contextlib.contextmanager
    def stage(self, name: str):
        yield


def _prepared(name: str, cache: str, work: str):
    model = next(m for m in real_models.MODELS if m.name == name)
    path = os.path.join(work, f"{name}.onnx")
    pathlib.Path(path).write_bytes(real_models.fetch(model, cache))
    proto = onnx.load(path, load_external_data=False)
    bed = speech.noise(cache)
    files = []
    for label, voices, seed, limit in (
        ("cal", speech.synthesized(cache), 0, model.calibration),
        ("eval", speech.recordings(cache), 1, model.evaluation),
    ):
        feeds = model.samples(proto, speech.stream(voices, bed, seed=seed), limit, 100)
        files.append(os.path.join(work, f"{label}.npz"))
        np.savez(files[-1], **feeds)
    source = model_source.load(path)
    specs = input_specs(source.program)
    report = {"numerics": {}, "warnings": [], "target": "ethos-u55-128", "ops": {}}
    options = types.SimpleNamespace(activation_defaults="onnxruntime", emission="auto")
    return onnx_route.prepare(
        source,
        options,
        calibration.load_samples(files[0], specs),
        calibration.load_samples(files[1], specs),
        report,
        _Silent(),
    )


def _with_sqrt_table(module, calibrate, entries: int):
    """`run(inputs)` of `module` with every sqrt an interpolated table over [0, the largest
    value it saw on `calibrate`]."""
    import copy

    module = copy.deepcopy(module)
    roots = [n for n in module.graph.nodes if "sqrt" in n.name.lower()]
    highest = {n.name: 0.0 for n in roots}

    class Seen(torch.fx.Interpreter):
        def run_node(self, n):
            out = super().run_node(n)
            if n.name in highest:
                highest[n.name] = max(highest[n.name], float(self.env[n.args[0]].max()))
            return out

    with torch.no_grad():
        for sample in calibrate:
            Seen(module).run(*sample)

    class Table(torch.nn.Module):
        def __init__(self, hi):
            super().__init__()
            self.hi, self.ys = hi, torch.sqrt(torch.linspace(0, hi, entries))

        def forward(self, x):
            pos = torch.clamp(x, 0, self.hi) / self.hi * (entries - 1)
            i = torch.clamp(pos.floor().long(), max=entries - 2)
            return self.ys[i] + (pos - i) * (self.ys[i + 1] - self.ys[i])

    for n in roots:
        name = f"sqrt_table_{n.name}"
        module.add_module(name, Table(highest[n.name]))
        with module.graph.inserting_after(n):
            table = module.graph.call_module(name, (n.args[0],))
        n.replace_all_uses_with(table)
        module.graph.erase_node(n)
    module.recompile()
    return accuracy.of_module(module)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a benchmarks/real_models.py name")
    parser.add_argument("--target", default="ethos-u55-128")
    parser.add_argument("--quantization", default="int8", help="int8, int16 or int16_state")
    parser.add_argument("--roles", action="store_true")
    parser.add_argument("--role", action="append", default=[], help="with --roles: only these")
    parser.add_argument("--only_alone", action="store_true", help="with --roles")
    parser.add_argument("--sensitivity", action="store_true")
    parser.add_argument(
        "--clip_inputs",
        action="store_true",
        help="fp32 with each input but the states clipped to the calibration's range",
    )
    parser.add_argument("--tosa", action="store_true")
    parser.add_argument("--lut_down", action="store_true", help="with --tosa")
    parser.add_argument("--sqrt_table", type=int, default=0)
    parser.add_argument("--int16_tables", default="")
    parser.add_argument("--widen", type=float, default=1.0, help="int16 ranges times F")
    parser.add_argument("--keep_recurrent_on_cpu", action="store_true", help="in float")
    parser.add_argument("--steps", default="float", choices=("float", "quantized"))
    parser.add_argument("--float_cell", action="store_true")
    parser.add_argument("--open_loop", action="store_true", help="frames from fp32's states")
    parser.add_argument("--out", default=None, help="JSON results")
    parser.add_argument(
        "--cache", default=os.path.expanduser("~/.cache/recurrent_lowering/real_models")
    )
    args = parser.parse_args()
    caller_directory.enter()
    widening = widened_ranges.int16(args.widen) if args.widen != 1.0 else contextlib.nullcontext()
    with widening:
        _attribute(args)


def _attribute(args) -> None:
    with tempfile.TemporaryDirectory() as work:
        prep = _prepared(args.model, args.cache, work)
    module, calibrate = prep.module, prep.calibration
    example = calibrate[0]
    fp32 = accuracy.of_module(module)
    state = streams.pairs([t.numpy() for t in example], fp32(example))

    def from_fp32_states(samples) -> list:  # each sample with the fp32 stream's states
        taken, _ = streams.fed_back(fp32, samples, state)
        return [tuple(torch.as_tensor(np.asarray(a)) for a in s) for s in taken]

    if state:  # calibrated mid-stream, as the CLI does
        calibrate = from_fp32_states(calibrate)
    evaluation = accuracy.Evaluation(prep.evaluation, state)
    if args.open_loop and state:  # every frame from fp32's states: no state fed back
        evaluation = accuracy.Evaluation(from_fp32_states(prep.evaluation))
    reference = accuracy.outputs(fp32, evaluation)
    results: dict = {"model": args.model, "target": args.target, "samples": len(prep.evaluation)}
    if args.open_loop:
        results["open_loop"] = bool(state)
    if args.widen != 1.0:
        results["widen"] = args.widen

    def score(outs) -> dict:
        out = {"sqnr_db": [round(x, 2) for x in sqnr_per_output(reference, outs)]}
        if reference[0].min() >= 0 and reference[0].max() <= 1:  # a probability
            same = (reference[0].ravel() > 0.5) == (np.reshape(outs[0], -1) > 0.5)
            out["decisions_equal"] = round(float(np.mean(same)), 4)
        return out

    tosa_spec = None  # the loop steps' (--steps quantized), set once the quantizer is made

    def converted_run(gm, step_of=None):
        return accuracy.outputs(accuracy.of_module(gm, True, tosa_spec, step_of), evaluation)

    options = Options(
        args.target,
        quantization=args.quantization,
        keep_recurrent_on_cpu=args.keep_recurrent_on_cpu,
    )
    plan = candidates.candidates(options, module, example)[0]
    with tempfile.TemporaryDirectory() as scratch:
        spec = flow.compile_spec(plan.target, pathlib.Path(scratch), None, None)
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

        gm = module_of(torch.export.export(flow.eval_mode(module), tuple(example)))
        quantizer = our_quantizer.create(spec, plan)
        tosa_spec = quantizer.tosa_spec if args.steps == "quantized" else None
        quantizer.float_samples = calibrate
        prepared = prepare_pt2e(gm, quantizer)
        for sample in calibrate:
            run_graph(prepared, *sample)
        converted = convert_pt2e(prepared, fold_quantize=False)  # weights can stay float
    results["all"] = score(converted_run(converted))
    print("all", results["all"], flush=True)
    if args.float_cell:
        cells: dict = {}

        def float_cell(node):
            if node not in cells:
                quantized = loop_step.simulated(node, quantizer.tosa_spec)
                cells[node] = cell_path.unquantized(quantized, program_of(node).num_states)
            return cells[node]

        results["float_cell"] = score(converted_run(converted, float_cell))
        print("steps quantized, cell-state path float", results["float_cell"], flush=True)
    if args.int16_tables:
        results["int16_tables"] = {}
        for spec in args.int16_tables.split(";"):
            emulated, names = int16_tables.emulate(converted, int16_tables.chooser(spec))
            results["int16_tables"][spec] = {**score(converted_run(emulated)), "tables": names}
            print(f"int16 tables emulated ({spec})", results["int16_tables"][spec], flush=True)
    if args.sqrt_table:
        results["sqrt_table"] = score(
            accuracy.outputs(_with_sqrt_table(module, calibrate, args.sqrt_table), evaluation)
        )
        print(f"sqrt as a {args.sqrt_table}-entry table", results["sqrt_table"], flush=True)
    if args.tosa:
        from recurrent_lowering.tools.lowering.npu import closed_loops

        with tempfile.TemporaryDirectory() as work:
            lowered = flow.lower(module, example, options, work, calibration_inputs=calibrate)
            _, tosa = closed_loops(lowered, module, evaluation.samples, evaluation.state)
            if args.lut_down:
                from recurrent_lowering.runtime import ethos_u55_int16

                program = lowered.tosa_files[0]
                program.write_bytes(ethos_u55_int16.truncating_luts(program.read_bytes()))
                lowered.verified = None
                _, down = closed_loops(lowered, module, evaluation.samples, evaluation.state)
        shaped = lambda outs: [np.reshape(t, np.shape(r)) for t, r in zip(outs, reference)]  # noqa: E731
        results["tosa"] = score(shaped(tosa))
        results["tosa"]["cycles"] = int(lowered.vela.summary.cycles) if lowered.vela else None
        print("TOSA reference model", results["tosa"], flush=True)
        if args.lut_down:
            results["lut_down"] = score(shaped(down))
            print("... its int16 LUTs rounding down", results["lut_down"], flush=True)
    if args.sensitivity:
        results["sensitivity"] = {}
        for where in ("state", "input"):
            for e in (1e-1, 3e-2, 1e-2, 1e-3):
                rng = np.random.default_rng(0)

                def noisy(inputs, e=e, where=where, rng=rng):
                    def add(a):
                        a = np.asarray(a)
                        rms = np.sqrt(np.mean(a.astype(np.float64) ** 2))
                        return a + (e * rms * rng.standard_normal(a.shape)).astype(a.dtype)

                    if where == "input":
                        return fp32([add(inputs[0]), *inputs[1:]])
                    out = fp32(inputs)
                    return [out[0], *(add(o) for o in out[1:])]

                key = f"{where} noise {e:g}"
                results["sensitivity"][key] = score(accuracy.outputs(noisy, evaluation))
                print(key, results["sensitivity"][key], flush=True)
    if args.clip_inputs:
        states = {i for i, _ in state}
        bounds = {
            i: (
                min(float(s[i].min()) for s in calibrate),
                max(float(s[i].max()) for s in calibrate),
            )
            for i in range(len(example))
            if i not in states and example[i].is_floating_point()
        }

        def clipped(inputs):
            inputs = [np.asarray(a) for a in inputs]
            for i, (low, high) in bounds.items():
                inputs[i] = np.clip(inputs[i], low, high)
            return fp32(inputs)

        results["clip_inputs"] = {**score(accuracy.outputs(clipped, evaluation)), "bounds": bounds}
        print("inputs clipped to the calibration's range", results["clip_inputs"], flush=True)
    if args.roles:
        roles = collections.defaultdict(list)
        for q, chain in sa.lossy_quantizes(converted).items():
            roles[sa.role(q)].extend(n.name for n in chain)
        weights = sa.weight_quantizes(converted)
        acts = {n for names in roles.values() for n in names}
        every = {n for names in weights.values() for n in names}
        results["weights_only"] = score(converted_run(sa.bypass(converted, every)))
        results["activations_only"] = score(converted_run(sa.bypass(converted, acts)))
        print(
            "weights only", results["weights_only"], "activations only", results["activations_only"]
        )
        results["roles"] = {}
        for name, nodes in sorted({**roles, **weights}.items()):
            if args.role and name not in args.role:
                continue
            results["roles"][name] = {"count": len(nodes)}
            if not args.only_alone:
                rest = sa.bypass(converted, (acts | every) - set(nodes))
                results["roles"][name]["float"] = score(converted_run(rest))
            results["roles"][name]["only"] = score(converted_run(sa.bypass(converted, set(nodes))))
            print(name, results["roles"][name], flush=True)
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
