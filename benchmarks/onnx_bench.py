"""onnxruntime latency of rewritten GRU/LSTM graphs vs the native op.

Batch 1, fp32, T=100, one thread, median over many runs. Writes a Markdown table;
`--profile` adds onnxruntime's per-op-type time per timestep for the rewritten graphs,
which says where the remaining gap to the native kernel goes.

  ./bazelw run //benchmarks:onnx_bench -- --out docs/results/onnx_benchmark.md --profile --repeat 3
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from recurrent_lowering.backends.onnx.rewrite import rewrite_model
from recurrent_lowering.benchmarks import caller_directory

CONFIGS = [  # (label, op, input_size, hidden_size, linear_before_reset, batch)
    ("GRU I64/H128", "GRU", 64, 128, 1, 1),
    ("GRU I256/H256", "GRU", 256, 256, 1, 1),
    ("GRU I256/H256 lbr=0", "GRU", 256, 256, 0, 1),
    ("GRU I512/H512", "GRU", 512, 512, 1, 1),
    ("LSTM I256/H256", "LSTM", 256, 256, 0, 1),
    ("GRU I256/H256 batch 8", "GRU", 256, 256, 1, 8),
    ("LSTM I256/H256 batch 8", "LSTM", 256, 256, 0, 8),
]
# Rewrites measured against the native op: (name, rewrite_model options).
VARIANTS = (
    ("unrolled", {"emission": "unrolled", "linear_mode": "gemm"}),
    ("unrolled_mm", {"emission": "unrolled", "linear_mode": "matmul"}),
    ("scan", {"emission": "loop", "linear_mode": "gemm"}),
    ("scan_mm", {"emission": "loop", "linear_mode": "matmul"}),
    ("ort", {"tune_for": "onnxruntime"}),
)
NAMES = tuple(name for name, _ in VARIANTS)
STEPS = 100
GATES = {"GRU": 3, "LSTM": 4, "RNN": 1}


def model(op: str, input_size: int, hidden: int, lbr: int, batch: int = 1, steps: int = STEPS):
    """One native node, weights uniform(-0.2, 0.2) from seed 0, outputs Y and Y_h."""
    rng = np.random.default_rng(0)
    g = GATES[op]

    def u(*shape):
        return rng.uniform(-0.2, 0.2, shape).astype(np.float32)

    inits = [
        numpy_helper.from_array(u(1, g * hidden, input_size), "W"),
        numpy_helper.from_array(u(1, g * hidden, hidden), "R"),
        numpy_helper.from_array(u(1, 2 * g * hidden), "B"),
    ]
    attrs = {"hidden_size": hidden}
    if op == "GRU":
        attrs["linear_before_reset"] = lbr
    node = helper.make_node(op, ["X", "W", "R", "B"], ["Y", "Y_h"], name=op.lower(), **attrs)
    graph = helper.make_graph(
        [node],
        "bench",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [steps, batch, input_size])],
        [
            helper.make_tensor_value_info("Y", TensorProto.FLOAT, [steps, 1, batch, hidden]),
            helper.make_tensor_value_info("Y_h", TensorProto.FLOAT, [1, batch, hidden]),
        ],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _session(m: onnx.ModelProto, profile_prefix: str = ""):
    """The settings every variant, native or rewritten, runs with: what a user gets from
    SessionOptions() for batch-1 latency on one thread. onnxruntime's defaults otherwise
    (ORT_ENABLE_ALL graph optimizations, sequential execution, weight prepacking, memory
    arena and pattern); spinning settings do not matter with no pool threads."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if profile_prefix:
        options.enable_profiling = True
        options.profile_file_prefix = profile_prefix
    return ort.InferenceSession(m.SerializeToString(), options, ["CPUExecutionProvider"])


def latencies_ms(models: dict, feeds: dict, runs: int, warmup: int = 20) -> dict:
    """Per variant: (median CPU ms, minimum wall ms, 10th-percentile CPU ms), runs
    interleaved across variants.

    With one intra-op thread onnxruntime runs every kernel on the calling thread, so the
    thread's CPU time excludes time spent preempted; on a shared, loaded machine that
    (and the best wall time) tracks the unloaded latency far better than a wall median.
    """
    sessions = {k: _session(m) for k, m in models.items()}
    for sess in sessions.values():
        for _ in range(warmup):
            sess.run(None, feeds)
    cpu = {k: [] for k in sessions}
    wall = {k: [] for k in sessions}
    for _ in range(runs):
        for k, sess in sessions.items():
            c0, w0 = time.thread_time_ns(), time.perf_counter_ns()
            sess.run(None, feeds)
            cpu[k].append(time.thread_time_ns() - c0)
            wall[k].append(time.perf_counter_ns() - w0)
    return {
        k: (
            statistics.median(cpu[k]) / 1e6,
            min(wall[k]) / 1e6,
            float(np.percentile(cpu[k], 10)) / 1e6,
        )
        for k in sessions
    }


def optimized_nodes(m: onnx.ModelProto) -> collections.Counter:
    """Op histogram of the graph onnxruntime actually runs (after its fusions)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "opt.onnx")
        options = ort.SessionOptions()
        options.optimized_model_filepath = path
        # only counted, never run: its warning that NCHWc layouts are machine-specific
        # (there is no Conv here) is noise
        options.log_severity_level = 3
        ort.InferenceSession(m.SerializeToString(), options, ["CPUExecutionProvider"])
        return collections.Counter(n.op_type for n in onnx.load(path).graph.node)


def gemv_probe_us(hidden: int = 256, runs: int = 2000) -> float:
    """Thread-CPU us of one numpy [1,H]x[H,3H] float32 product, the GEMV at the heart of
    every step: how fast this machine streams a step's weights right now (a native GRU
    I256/H256 at 0.88 ms per T=100 sequence would need under 8.8 us per whole step)."""
    rng = np.random.default_rng(0)
    r = rng.uniform(-0.05, 0.05, (hidden, 3 * hidden)).astype(np.float32)
    h = rng.uniform(-1, 1, (1, hidden)).astype(np.float32)
    for _ in range(100):
        h @ r
    times = []
    for _ in range(5):
        t0 = time.thread_time_ns()
        for _ in range(runs):
            h @ r
        times.append((time.thread_time_ns() - t0) / runs / 1e3)
    return min(times)


def profile_per_step(m: onnx.ModelProto, feeds: dict, runs: int = 30) -> dict:
    """op type -> (nodes per step, us per step) from onnxruntime's profiler.

    Uses each op type's median kernel time (times nodes per step), so the occasional
    preempted kernel on a shared machine does not dominate.
    """
    with tempfile.TemporaryDirectory() as tmp:
        sess = _session(m, os.path.join(tmp, "prof"))
        for _ in range(runs):
            sess.run(None, feeds)
        path = sess.end_profiling()
        with open(path) as f:
            events = json.load(f)
    durations = collections.defaultdict(list)
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            durations[e["args"].get("op_name", "?")].append(e["dur"])
    out = {}
    for op, ds in durations.items():
        per_step = len(ds) / runs / STEPS
        out[op] = (per_step, statistics.median(ds) * per_step)
    return dict(sorted(out.items(), key=lambda kv: -kv[1][1]))


def op_costs(hidden: int = 256, chain: int = 400) -> dict:
    """us of thread CPU per unit (one node, or a pair where a second node keeps the shape)
    for the step ops of a GRU/LSTM at `hidden`: chains of identical units, onnxruntime's
    per-node cost in isolation."""
    rng = np.random.default_rng(0)
    h3 = 3 * hidden

    def ints(name, v):
        return numpy_helper.from_array(np.asarray(v, np.int64), name)

    cases = {
        f"MatMul [1,1,{hidden}]x[{hidden},{h3}]": (
            [1, 1, hidden],
            lambda p, k: [
                helper.make_node("MatMul", [p, "R"], [f"m{k}"]),
                helper.make_node("Slice", [f"m{k}", "s0", "sh", "ax"], [f"o{k}"]),
            ],
            [
                numpy_helper.from_array(
                    rng.uniform(-0.05, 0.05, (hidden, h3)).astype(np.float32), "R"
                ),
                ints("s0", [0]),
                ints("sh", [hidden]),
                ints("ax", [-1]),
            ],
            2,
        ),
        f"Concat [1,1,{hidden}] x2 (+Slice)": (
            [1, 1, hidden],
            lambda p, k: [
                helper.make_node("Concat", [p, p], [f"c{k}"], axis=-1),
                helper.make_node("Slice", [f"c{k}", "s0", "sh", "ax"], [f"o{k}"]),
            ],
            [ints("s0", [0]), ints("sh", [hidden]), ints("ax", [-1])],
            2,
        ),
        f"Add [1,1,{hidden}]": (
            [1, 1, hidden],
            lambda p, k: [helper.make_node("Add", [p, "x"], [f"o{k}"])],
            [],
            1,
        ),
        f"Mul [1,1,{hidden}]": (
            [1, 1, hidden],
            lambda p, k: [helper.make_node("Mul", [p, "x"], [f"o{k}"])],
            [],
            1,
        ),
        f"Sigmoid [1,1,{hidden}]": (
            [1, 1, hidden],
            lambda p, k: [helper.make_node("Sigmoid", [p], [f"o{k}"])],
            [],
            1,
        ),
        f"Tanh [1,1,{hidden}]": (
            [1, 1, hidden],
            lambda p, k: [helper.make_node("Tanh", [p], [f"o{k}"])],
            [],
            1,
        ),
        f"Split [1,1,{2 * hidden}] in 2 (+Concat)": (
            [1, 1, 2 * hidden],
            lambda p, k: [
                helper.make_node("Split", [p, "sp"], [f"a{k}", f"b{k}"], axis=-1),
                helper.make_node("Concat", [f"b{k}", f"a{k}"], [f"o{k}"], axis=-1),
            ],
            [ints("sp", [hidden, hidden])],
            2,
        ),
        f"Slice [1,1,{2 * hidden}] (+Concat)": (
            [1, 1, 2 * hidden],
            lambda p, k: [
                helper.make_node("Slice", [p, "s0", "sh", "ax"], [f"a{k}"]),
                helper.make_node("Concat", [f"a{k}", f"a{k}"], [f"o{k}"], axis=-1),
            ],
            [ints("s0", [0]), ints("sh", [hidden]), ints("ax", [-1])],
            2,
        ),
    }
    result = {}
    for label, (shape, make, inits, per) in cases.items():
        nodes, prev = [], "x"
        for k in range(chain // per):
            nodes += make(prev, k)
            prev = f"o{k}"
        graph = helper.make_graph(
            nodes,
            "chain",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
            [helper.make_tensor_value_info(prev, TensorProto.FLOAT, shape)],
            inits,
        )
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        x = {"x": rng.uniform(-0.1, 0.1, shape).astype(np.float32)}
        cpu = latencies_ms({"m": m}, x, 100)["m"][0]
        result[label] = cpu * 1e3 / (chain // per)
    return result


def step_breakdown(op: str = "GRU", inp: int = 256, hidden: int = 256, runs: int = 200) -> dict:
    """us of thread CPU per timestep: native, rewritten, and the parts of the rewritten
    step measured alone (hoisted projection; the recurrent products as a chain of Gemms,
    one for all gates or one per activation group). What is left of the rewritten step
    is the per-node cost of its elementwise gate math."""
    rng = np.random.default_rng(0)
    g, steps = GATES[op], STEPS

    def weight(name, *shape):
        return numpy_helper.from_array(rng.uniform(-0.05, 0.05, shape).astype(np.float32), name)

    def single(nodes, x_shape, out, out_shape, inits):
        graph = helper.make_graph(
            nodes,
            "part",
            [helper.make_tensor_value_info("X", TensorProto.FLOAT, x_shape)],
            [helper.make_tensor_value_info(out, TensorProto.FLOAT, out_shape)],
            inits,
        )
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])

    def products(widths):
        """h' = first H columns of Gemm(h, R_0, C=x_t) (times the other products)."""
        nodes = [
            helper.make_node(
                "Split", ["X"], [f"x{t}" for t in range(steps)], axis=0, num_outputs=steps
            )
        ]
        inits = [
            weight("h0", 1, hidden),
            numpy_helper.from_array(np.array([hidden, widths[0] - hidden], np.int64), "sp"),
        ]
        inits += [weight(f"R{k}", hidden, w) for k, w in enumerate(widths)]
        h = "h0"
        for t in range(steps):
            prev = h
            nodes.append(helper.make_node("Gemm", [prev, "R0", f"x{t}"], [f"a{t}"]))
            nodes.append(helper.make_node("Split", [f"a{t}", "sp"], [f"s{t}", f"r{t}"], axis=1))
            h = f"s{t}"
            for k in range(1, len(widths)):
                nodes.append(helper.make_node("Gemm", [prev, f"R{k}"], [f"b{t}_{k}"]))
                nodes.append(helper.make_node("Mul", [h, f"b{t}_{k}"], [f"m{t}_{k}"]))
                h = f"m{t}_{k}"
        m = single(nodes, [steps, widths[0]], h, [1, hidden], inits)
        return m, {"X": rng.uniform(-1, 1, (steps, widths[0])).astype(np.float32)}

    x = {"X": rng.uniform(-1, 1, (steps, 1, inp)).astype(np.float32)}
    native = model(op, inp, hidden, 1 if op == "GRU" else 0)
    projection = single(
        [helper.make_node("MatMul", ["X", "W"], ["p"]), helper.make_node("Add", ["p", "b"], ["y"])],
        [steps, 1, inp],
        "y",
        [steps, 1, g * hidden],
        [weight("W", inp, g * hidden), weight("b", 1, 1, g * hidden)],
    )
    groups = [2 * hidden, hidden] if op == "GRU" else [3 * hidden, hidden]
    parts = {
        f"native {op}": (native, x),
        f"rewritten {op} (unrolled)": (rewrite_model(native, emission="unrolled"), x),
        f"rewritten {op} (scan)": (rewrite_model(native, emission="loop"), x),
        f"rewritten {op} (tune_for onnxruntime)": (
            rewrite_model(native, tune_for="onnxruntime"),
            x,
        ),
        "hoisted projection alone": (projection, x),
        f"recurrent product alone: Gemm [1,{hidden}]x[{hidden},{g * hidden}] + Split": products(
            [g * hidden]
        ),
        "recurrent products alone: one Gemm per activation group "
        f"({' + '.join(str(w) for w in groups)} columns) + Split + Mul": products(groups),
    }
    return {k: latencies_ms({k: m}, f, runs)[k][0] * 1e3 / steps for k, (m, f) in parts.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="", help="Markdown file to write")
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--profile", action="store_true", help="add per-op cost per step")
    parser.add_argument(
        "--repeat", type=int, default=1, help="measure N times; report median and spread"
    )
    args = parser.parse_args(argv)
    caller_directory.enter()

    rows, profiles = [], []
    load_start, probe = os.getloadavg()[0], gemv_probe_us()
    for label, op, inp, hidden, lbr, batch in CONFIGS:
        native = model(op, inp, hidden, lbr, batch)
        x = np.random.default_rng(1).uniform(-1, 1, (STEPS, batch, inp)).astype(np.float32)
        feeds = {"X": x}
        variants = {"native": native}
        variants.update((name, rewrite_model(native, **opts)) for name, opts in VARIANTS)
        want = _session(native).run(None, feeds)
        for name, m in variants.items():
            for g, w in zip(_session(m).run(None, feeds), want):
                np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5, err_msg=f"{label} {name}")
        repeats = [latencies_ms(variants, feeds, args.runs) for _ in range(args.repeat)]
        ms = {
            k: (statistics.median(r[k][0] for r in repeats), min(r[k][1] for r in repeats))
            for k in variants
        }
        spread = {k: [r[k][0] / r["native"][0] for r in repeats] for k in variants if k != "native"}
        low = {k: [r[k][2] / r["native"][2] for r in repeats] for k in variants if k != "native"}
        emitted = collections.Counter(n.op_type for n in variants["unrolled"].graph.node)
        ran = optimized_nodes(variants["unrolled"])
        rows.append((label, ms, spread, emitted, ran, low))
        print(
            f"{label}: "
            + ", ".join(f"{k} {c:.3f}/{w:.3f}" for k, (c, w) in ms.items())
            + " ms (cpu median/wall min), unrolled/native "
            + f"{statistics.median(spread['unrolled']):.2f}x"
            + f" ({min(spread['unrolled']):.2f}-{max(spread['unrolled']):.2f})"
            + f", scan/native {statistics.median(spread['scan']):.2f}x"
            + f"; p10 unrolled {statistics.median(low['unrolled']):.2f}x"
            + f" scan {statistics.median(low['scan']):.2f}x"
            + f" ort {statistics.median(low['ort']):.2f}x"
            + f", {sum(emitted.values())} nodes emitted, {sum(ran.values())} after ORT",
            flush=True,
        )
        if args.profile and batch == 1:
            profiles.append((label, profile_per_step(variants["unrolled"], feeds)))

    load = os.getloadavg()[0]
    probe = min(probe, gemv_probe_us())
    lines = [
        "# onnxruntime: rewritten recurrent nodes vs the native op",
        "",
        f"onnxruntime {ort.__version__}, batch 1 unless stated, fp32, T={STEPS}, one thread "
        "(the same SessionOptions for native and rewritten: intra_op_num_threads=1, "
        "inter_op_num_threads=1, ORT_SEQUENTIAL, ORT_ENABLE_ALL, everything else default, "
        f"so weights are prepacked), {args.runs} runs per variant after 20 warm-up runs, "
        "interleaved across variants; weights uniform(-0.2, 0.2), seed 0; outputs Y and Y_h; "
        "opset 17.",
        "",
        "Command:",
        "",
        "```",
        "./bazelw run //benchmarks:onnx_bench -- --out docs/results/onnx_benchmark.md "
        f"--profile --repeat {args.repeat}",
        "```",
        "",
        "Variants: `unrolled` (one set of ops per step; steps are rank 2, so each product is",
        "one Gemm with its bias or x_t as C), `unrolled_mm` (MatMul+Add always), `scan`",
        "(the loop form, one ONNX Scan, same step ops; x_t's gate groups are split before the",
        "loop and h' is recombined after it from two Scan outputs), `scan_mm` (MatMul+Add),",
        '`ort` (`rewrite_model(tune_for="onnxruntime")`, `--onnx_tune_for onnxruntime` in the',
        "CLI: Scan, its weights read through Optional -> OptionalGetElement so that onnxruntime",
        "does not prepack them).",
        "Each cell: median thread CPU time / best wall time, in ms; ratios to native use CPU",
        "time (with one intra-op thread every kernel runs on the calling thread, so CPU time",
        "leaves out time spent preempted on a shared machine). "
        f"{args.repeat} measurement(s) per variant: times are the median of the repeats'",
        "medians; ratios are the median ratio with (min-max over repeats). "
        f"Load average (1 min) at start / end: {load_start:.1f} / {load:.1f} on "
        f"{os.cpu_count()} cores. Machine probe: one numpy [1,256]x[256,768] float32 product "
        f"takes {probe:.1f} us of thread CPU (best of 10 x 2000).",
        "",
        "| config | native | "
        + " | ".join(f"{k} | ratio" for k in NAMES)
        + " | nodes/step emitted | after ORT fusions |",
        "|---|---|" + "---|---|" * len(NAMES) + "---|---|",
    ]
    for label, ms, spread, emitted, ran, _ in rows:
        cells = [f"{ms['native'][0]:.3f} / {ms['native'][1]:.3f}"]
        for k in NAMES:
            ratio = f"{statistics.median(spread[k]):.2f}x"
            if len(spread[k]) > 1:
                ratio += f" ({min(spread[k]):.2f}-{max(spread[k]):.2f})"
            cells += [f"{ms[k][0]:.3f} / {ms[k][1]:.3f}", ratio]
        lines.append(
            f"| {label} | "
            + " | ".join(cells)
            + f" | {sum(emitted.values()) / STEPS:.1f} | {sum(ran.values()) / STEPS:.1f} |"
        )
    lines += [
        "",
        "The same runs, ratios of the 10th percentile of thread CPU time (the runs least",
        "disturbed by other jobs; median over repeats, min-max in brackets):",
        "",
        "| config | " + " | ".join(NAMES) + " |",
        "|---|" + "---|" * len(NAMES),
    ]
    for label, _, _, _, _, low in rows:
        cells = []
        for k in NAMES:
            cell = f"{statistics.median(low[k]):.2f}x"
            if len(low[k]) > 1:
                cell += f" ({min(low[k]):.2f}-{max(low[k]):.2f})"
            cells.append(cell)
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Ops per step of the unrolled graphs (emitted -> after onnxruntime's fusions):",
        "",
    ]
    for label, _, _, emitted, ran, _ in rows:
        ops = sorted(set(emitted) | set(ran), key=lambda k: -(emitted[k] + ran[k]))
        lines.append(
            f"- {label}: "
            + ", ".join(f"{k} {emitted[k] / STEPS:.2f}->{ran[k] / STEPS:.2f}" for k in ops)
        )
    if args.profile:
        lines += [
            "",
            "### Cost of step ops in isolation (chains of 400 nodes, thread CPU)",
            "",
            "Per unit: one node, or a pair where a second node restores the shape for the",
            "next link (MatMul+Slice, Split+Concat, Slice+Concat, Concat+Slice).",
            "",
            "| unit | us |",
            "|---|---|",
        ]
        lines += [f"| {k} | {v:.2f} |" for k, v in op_costs().items()]
    if args.profile:
        for op in ("GRU", "LSTM"):
            parts = step_breakdown(op)
            lines += [
                "",
                f"### Where a step's time goes, {op} I256/H256 (thread CPU, us per timestep)",
                "",
                "Each part measured alone as a chain of T=100 steps; the native op's step",
                "includes its share of its own input projection.",
                "",
                "| part | us per step |",
                "|---|---|",
            ]
            lines += [f"| {k} | {v:.1f} |" for k, v in parts.items()]
    for label, prof in profiles:
        lines += [
            "",
            f"### Per step, {label} (unrolled; onnxruntime profiler, after its fusions)",
            "",
            "Median kernel time per op type times nodes per step; the profiler adds its",
            "own cost to every kernel, so cheap ops look dearer than they are.",
            "",
            "| op | nodes per step | us per step |",
            "|---|---|---|",
        ]
        for op, (count, us) in prof.items():
            lines.append(f"| {op} | {count:.2f} | {us:.2f} |")
        total_us = sum(us for _, us in prof.values())
        lines.append(f"| total | {sum(c for c, _ in prof.values()):.2f} | {total_us:.2f} |")
    text = "\n".join(lines) + "\n"
    if args.out:
        marker = "<!-- measured results end -->"
        kept = ""
        if os.path.exists(args.out):  # keep the hand-written analysis below the tables
            with open(args.out) as f:
                old = f.read()
            kept = marker + old.split(marker, 1)[1] if marker in old else ""
        with open(args.out, "w") as f:
            f.write(text + ("\n" + kept if kept else ""))
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
