"""Lowering models as Bazel build actions, for workspaces that depend on recurrent_lowering.

    load("@recurrent_lowering//tools:defs.bzl", "npu_model", "npu_model_test")

    npu_model(name = "kws_u55", model = "kws.onnx", target = "ethos-u55-128")
    npu_model_test(name = "kws_u55_quality", model = ":kws_u55", min_sqnr_db = 30)

The action runs the same code as `bazel run //tools:lower`, with every input declared and
its outputs declared up front, so it is cached, sandboxed and remote-executable like any
other action.
"""

_EXTENSIONS = {"aten": ".pt2", "onnx": ".onnx"}

NpuModelInfo = provider(
    doc = "Files produced by npu_model.",
    fields = {
        "artifact": "the lowered model (.pte, .onnx or .pt2)",
        "report": "the JSON report",
        "target": "the --target it was lowered for",
    },
)

def _is_npu(target):
    return target.startswith("ethos-u")

def _npu_model_impl(ctx):
    target = ctx.attr.target
    name = ctx.label.name
    artifact = ctx.actions.declare_file(name + _EXTENSIONS.get(target, ".pte"))
    report = ctx.actions.declare_file(name + ".report.json")
    log = ctx.actions.declare_file(name + ".log")
    outputs = [artifact, report, log]
    args = ctx.actions.args()
    args.add(ctx.file.model.path)
    args.add("--target", target)
    args.add("--output", artifact.path)
    args.add("--report", report.path)
    args.add("--log", log.path)
    if target not in ("aten", "onnx"):
        tosa = ctx.actions.declare_file(name + ".tosa")
        outputs.append(tosa)
        args.add("--tosa_output", tosa.path)
    if _is_npu(target):
        summary = ctx.actions.declare_file(name + ".vela_summary.csv")
        outputs.append(summary)
        args.add("--vela_summary", summary.path)
    inputs = [ctx.file.model]
    if ctx.file.calibration:
        inputs.append(ctx.file.calibration)
        args.add("--calibration", ctx.file.calibration.path)
    args.add_all(ctx.attr.options)
    ctx.actions.run(
        executable = ctx.executable._lower,
        arguments = [args],
        inputs = inputs,
        outputs = outputs,
        mnemonic = "NpuLower",
        progress_message = "Lowering %s for %s" % (ctx.file.model.short_path, target),
        # Libraries under the tool write caches under $HOME; keep them inside the sandbox.
        env = {"HOME": "/tmp", "MPLBACKEND": "Agg"},
        execution_requirements = {"block-network": ""},
    )
    return [
        DefaultInfo(files = depset(outputs)),
        NpuModelInfo(artifact = artifact, report = report, target = target),
    ]

npu_model = rule(
    implementation = _npu_model_impl,
    doc = "Lowers `model` for `target` with //tools:lower; outputs the artifact, the JSON " +
          "report and, for TOSA/Ethos-U targets, the .tosa (and Vela's summary).",
    attrs = {
        "model": attr.label(allow_single_file = [".onnx", ".pt2"], mandatory = True),
        "target": attr.string(mandatory = True, doc = "a //tools:lower --target name"),
        "calibration": attr.label(allow_single_file = [".npz"]),
        "options": attr.string_list(doc = "further //tools:lower flags, e.g. --emission=loop"),
        "_lower": attr.label(
            default = Label("//tools:lower"),
            executable = True,
            cfg = "exec",
        ),
    },
)

def _npu_model_test_impl(ctx):
    report = ctx.attr.model[NpuModelInfo].report
    checker = ctx.executable._check
    script = ctx.actions.declare_file(ctx.label.name + ".sh")
    limits = []
    for key, value in [
        ("--min_sqnr_db", ctx.attr.min_sqnr_db),
        ("--max_abs_err", ctx.attr.max_abs_err),
        ("--max_cycles", ctx.attr.max_cycles),
    ]:
        if value:
            limits.append("%s=%s" % (key, value))
    ctx.actions.write(
        script,
        "#!/bin/sh\nexec %s %s %s\n" % (checker.short_path, report.short_path, " ".join(limits)),
        is_executable = True,
    )
    runfiles = ctx.runfiles(files = [report]).merge(ctx.attr._check[DefaultInfo].default_runfiles)
    return [DefaultInfo(executable = script, runfiles = runfiles)]

npu_model_test = rule(
    implementation = _npu_model_test_impl,
    test = True,
    doc = "Fails when the lowered model's report crosses a threshold: SQNR below " +
          "min_sqnr_db, max abs error above max_abs_err, or NPU cycles above max_cycles. " +
          "Thresholds are strings so decimals are exact (e.g. \"1e-5\").",
    attrs = {
        "model": attr.label(mandatory = True, providers = [NpuModelInfo]),
        "min_sqnr_db": attr.string(),
        "max_abs_err": attr.string(),
        "max_cycles": attr.string(),
        "_check": attr.label(
            default = Label("//tools:check_report"),
            executable = True,
            cfg = "target",
        ),
    },
)
