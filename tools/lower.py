"""lower: take a model with recurrent layers to elementary ops, an NPU artifact and a report.

  bazel run //tools:lower -- MODEL [--target ethos-u55-128] [--output PATH] [--report R.json]

MODEL is a .pt2 (torch.export.save), an .onnx file, or a bundled example name. Exit codes:
0 done, 1 the input or a flag cannot be lowered (one line says why), 2 an internal error.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import sys
import tempfile
import traceback

from absl import app, flags

from recurrent_lowering.tools.lowering import console, model_source, report, targets
from recurrent_lowering.tools.lowering.errors import LoweringError, first_line
from recurrent_lowering.tools.lowering.progress import Progress
from recurrent_lowering.tools.lowering.staging import staged_outputs

EXIT_USER_ERROR = 1
EXIT_INTERNAL_ERROR = 2

FLAGS = flags.FLAGS
flags.DEFINE_string(
    "target", "ethos-u55-128", f"what to produce; one of: {', '.join(targets.TARGETS)}"
)
flags.DEFINE_string("output", None, "output file (default: MODEL name + extension, here)")
flags.DEFINE_string("report", None, "write the JSON report here (a PNG plot goes beside it)")
flags.DEFINE_string("tosa_output", None, "TOSA/Ethos-U targets: also write the .tosa here")
flags.DEFINE_string("vela_summary", None, "Ethos-U targets: also write Vela's summary CSV here")
flags.DEFINE_string(
    "calibration",
    None,
    ".npz files (comma-separated) of input samples for quantization (and numerics, unless "
    "--evaluation)",
)
flags.DEFINE_string(
    "evaluation", None, ".npz files (comma-separated) of input samples for the numerics check"
)
flags.DEFINE_bool(
    "stream",
    True,
    "a model whose inputs after the first come back as its outputs (states) is calibrated "
    "and checked as a stream, each sample's states the previous sample's outputs",
)
flags.DEFINE_bool("keep_recurrent_on_cpu", False, "leave recurrent layers on the CPU")
flags.DEFINE_enum("emission", "auto", ["auto", "unrolled", "loop"], "recurrent emission form")
flags.DEFINE_enum(
    "quantization",
    "auto",
    ["auto", "int8", "int16", "int16_w16", "int16_state"],
    "INT targets: auto (Ethos-U: int16 activations for the recurrent layers and/or the rest "
    "where it costs at most --cycle_budget over int8, by a cost model of Vela, or where it "
    "buys the --min_sqnr int8 misses; else int8), "
    "int8 or int16 activations, int16_w16 (int16 activations, each weight as two int8 parts: "
    "about 16-bit weights at twice their MACs), or int8 with the recurrent steps (state and "
    "gate arithmetic) in int16 (loop form)",
)
flags.DEFINE_float(
    "cycle_budget", None, "--quantization auto: percent more cycles than int8 it may spend (3)"
)
flags.DEFINE_float(
    "min_sqnr",
    None,
    "--quantization auto: dB against fp32 every output (states included) should reach on the "
    "evaluation samples, as a simulation predicts; wider candidates are weighed when the "
    "choice misses it (30)",
)
flags.DEFINE_enum(
    "recurrent_weight_bits",
    "8",
    ["8", "7", "6", "5", "4"],
    "Ethos-U / TOSA INT: bits of the weights every timestep reads (R, an LSTM's projection); "
    "fewer bits, fewer bytes streamed per step, lower SQNR (4: TOSA INT4)",
)
flags.DEFINE_string("system_config", None, "Ethos-U: Vela system config (default: ExecuTorch's)")
flags.DEFINE_string(
    "memory_mode", None, "Ethos-U: Vela memory mode, e.g. Sram_Only (default: ExecuTorch's)"
)
flags.DEFINE_enum(
    "onnx_activation_defaults",
    "onnxruntime",
    ["onnxruntime", "spec"],
    "defaults for omitted ONNX activation alpha/beta: onnxruntime's or the ONNX spec's",
)
flags.DEFINE_enum(
    "onnx_tune_for",
    "portable",
    ["portable", "onnxruntime"],
    "--target onnx: plain ops for any runtime, or the forms onnxruntime runs fastest at "
    "batch 1 (Scan, loop weights not prepacked)",
)


flags.DEFINE_bool(
    "verbose",
    False,
    "show other libraries' logs on the terminal, and an internal error's traceback",
)
flags.DEFINE_string(
    "log",
    None,
    "where other libraries' logs go (default: beside --report, else beside the output, "
    "as NAME.log)",
)


def _path_or_none(arg: str | None):
    return model_source.resolve_path(arg) if arg else None


def _paths_or_none(arg: str | None):
    """Comma-separated paths, each resolved, or None."""
    if not arg:
        return None
    return [model_source.resolve_path(p) for p in arg.split(",") if p]


def _log_destination(output: pathlib.Path) -> pathlib.Path:
    if FLAGS.log:
        return model_source.resolve_path(FLAGS.log)
    beside = model_source.resolve_path(FLAGS.report) if FLAGS.report else output
    return beside.with_suffix(".log")


def run(argv: list[str], terminal: console.Terminal, captured: bool = True) -> dict:
    """Lowers argv[1] as the flags say; returns the report. `captured`: other libraries'
    output goes to a log file, whose destination the report names."""
    if len(argv) != 2:
        raise LoweringError("expected exactly one MODEL argument (a .pt2, an .onnx or an example)")
    handler = targets.handler(FLAGS.target)
    options = targets.Options(
        emission=FLAGS.emission,
        quantization=FLAGS.quantization,
        cycle_budget=FLAGS.cycle_budget,
        min_sqnr=FLAGS.min_sqnr,
        calibration=_paths_or_none(FLAGS.calibration),
        evaluation=_paths_or_none(FLAGS.evaluation),
        stream=FLAGS.stream,
        keep_recurrent_on_cpu=FLAGS.keep_recurrent_on_cpu,
        activation_defaults={"spec": "onnx"}.get(  # the reader's name for the ONNX spec's
            FLAGS.onnx_activation_defaults, FLAGS.onnx_activation_defaults
        ),
        tune_for=FLAGS.onnx_tune_for,
        tosa_output=_path_or_none(FLAGS.tosa_output),
        vela_summary=_path_or_none(FLAGS.vela_summary),
        recurrent_weight_bits=int(FLAGS.recurrent_weight_bits),
        system_config=FLAGS.system_config,
        memory_mode=FLAGS.memory_mode,
    )
    if FLAGS.onnx_activation_defaults != "onnxruntime" and not argv[1].endswith(".onnx"):
        raise LoweringError(
            "--onnx_activation_defaults resolves omitted alpha/beta of ONNX recurrent nodes; "
            f"{argv[1]} is not an .onnx model"
        )
    if options.tune_for != "portable" and FLAGS.target != "onnx":
        raise LoweringError(
            f"--onnx_tune_for {options.tune_for} shapes a rewritten .onnx for that runtime; "
            f"it applies to --target onnx, not {FLAGS.target}"
        )
    npu_only = {
        "--quantization": options.quantization != "auto",
        "--cycle_budget": options.cycle_budget is not None,
        "--min_sqnr": options.min_sqnr is not None,
        "--keep_recurrent_on_cpu": options.keep_recurrent_on_cpu,
        "--recurrent_weight_bits": options.recurrent_weight_bits != 8,
        "--system_config": options.system_config is not None,
        "--memory_mode": options.memory_mode is not None,
        "--tosa_output": options.tosa_output is not None,
        "--vela_summary": options.vela_summary is not None,
    }
    for flag, given in npu_only.items():
        if given and FLAGS.target in ("aten", "onnx"):
            raise LoweringError(f"{flag} applies to TOSA and Ethos-U targets, not {FLAGS.target}")
    result = report.empty(FLAGS.target, argv[1])
    progress = Progress(result, terminal)
    with progress.stage(f"load {pathlib.Path(argv[1]).name}"):
        source = model_source.load(argv[1])
    result["warnings"].extend(source.notes)
    output = model_source.resolve_path(
        FLAGS.output or targets.default_output_name(source.name, FLAGS.target)
    )
    if source.path is not None and output == source.path:
        raise LoweringError(f"{output}: the output would overwrite the input model")
    log = _log_destination(output) if captured else None
    named = {
        "--output": output,
        "--report": FLAGS.report,
        "--log": log,
        "--tosa_output": options.tosa_output,
        "--vela_summary": options.vela_summary,
    }
    seen: dict = {}  # resolved path -> the flag that named it
    for flag, path in named.items():
        if path is None:
            continue
        path = model_source.resolve_path(str(path))
        if path.is_dir():
            raise LoweringError(f"{path}: is a directory; {flag} names the file to write")
        existing = next(p for p in path.parents if p.exists())
        if not existing.is_dir():
            raise LoweringError(f"{path}: {existing} is a file, not a directory ({flag})")
        if path in seen:
            raise LoweringError(f"{path}: named by both {seen[path]} and {flag}")
        seen[path] = flag
    result["output"] = str(output)
    result["log"] = str(log) if log else None
    with staged_outputs(output) as staging:
        handler(source, options, staging, output, result, progress)
        progress.finish()
        if FLAGS.report:
            report_path = model_source.resolve_path(FLAGS.report)
            staging.path_for(report_path).write_text(report.to_json(result))
    return result


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _keep_log(log: pathlib.Path, destination: pathlib.Path) -> None:
    try:
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(log, destination)
    except OSError as e:
        print(f"lower: warning: the log stays at {log} ({e})", file=sys.stderr)


def main(argv: list[str]) -> int:
    from recurrent_lowering.passes import SpecError

    log = None
    if not FLAGS.verbose:
        handle, name = tempfile.mkstemp(prefix="lower-", suffix=".log")
        os.close(handle)
        log = pathlib.Path(name)
    result, failure, logged = None, None, 0
    with console.captured(log) as terminal:
        try:
            result = run(argv, terminal, captured=log is not None)
        except (LoweringError, SpecError) as e:
            failure = EXIT_USER_ERROR, f"lower: error: {_one_line(e)}"
        except KeyboardInterrupt:
            failure = 130, "lower: interrupted"
        except Exception as e:  # noqa: BLE001 - any other failure is ours: one line, no traceback
            sys.stderr.flush()
            logged = log.stat().st_size if log else 0
            traceback.print_exc()  # into the log; on the terminal with --verbose
            where = f"; log: {log}" if log else ""
            failure = (
                EXIT_INTERNAL_ERROR,
                (
                    f"lower: internal error: {type(e).__name__}: {first_line(e)} "
                    f"(rerun with --verbose for the traceback{where})"
                ),
            )
    if failure is None:
        if log is not None:
            _keep_log(log, pathlib.Path(result["log"]))
        print(report.summary(result))
        return 0
    code, line = failure
    if log is not None and code == EXIT_INTERNAL_ERROR:
        for text in console.tail(log, 8, limit=logged):  # other libraries' last words
            print(f"  | {text}", file=sys.stderr)
    elif log is not None:
        log.unlink(missing_ok=True)
    print(line, file=sys.stderr)
    return code


def entry() -> None:
    app.run(main)


if __name__ == "__main__":
    entry()
