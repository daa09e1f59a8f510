"""Lowering models as Bazel build actions, for workspaces that depend on recurrent_lowering.

    load("@recurrent_lowering//tools:defs.bzl", "npu_model", "npu_model_test")

    npu_model(name = "kws_u55", model = "kws.onnx", target = "ethos-u55-128")
    npu_model_test(name = "kws_u55_quality", model = ":kws_u55", min_sqnr_db = "30")

(`recurrent_lowering` is whatever name the workspace gave this repository.) Each model is one
action running //tools:lower through tools/npu_action.py in the pinned Python environment
(@recurrent_lowering_python). Its inputs are the model, the calibration data, the Python
sources and data files of the route the model takes (an .onnx rewritten to ONNX reads none
of the ExecuTorch adapter, a .pt2 none of the ONNX one) and the environment's launcher and
identity; no input or argument is an absolute path. So the action is cached, sandboxed and
remote-executable like any other, with one key in every checkout and on every machine with
that environment.
"""

_EXTENSIONS = {"aten": ".pt2", "onnx": ".onnx"}

NpuModelInfo = provider(
    doc = "Files produced by npu_model; a field is None where the target has no such file.",
    fields = {
        "artifact": "the lowered model (.pte, .onnx or .pt2)",
        "report": "the JSON report (reproducible: no wall-clock times, no host paths)",
        "tosa": "TOSA/Ethos-U targets: the .tosa flatbuffer given to Vela",
        "vela_summary": "Ethos-U targets: Vela's summary CSV",
        "plot": "TOSA/Ethos-U targets: the error-per-timestep PNG",
        "log": "everything the lowering printed (not reproducible)",
        "timings": "wall-clock seconds per stage, JSON (not reproducible)",
        "target": "the --target it was lowered for",
    },
)

def _is_npu(target):
    return target.startswith("ethos-u")

def _route(ctx):
    """The py_library of the code this model and target reach."""
    onnx = ctx.file.model.path.endswith(".onnx")
    if ctx.attr.target in ("aten", "onnx"):
        return ctx.attr._route_onnx if onnx else ctx.attr._route_aten
    return ctx.attr._route_npu_onnx if onnx else ctx.attr._route_npu_torch

def _npu_model_impl(ctx):
    target = ctx.attr.target
    name = ctx.label.name
    artifact = ctx.actions.declare_file(name + _EXTENSIONS.get(target, ".pte"))
    report = ctx.actions.declare_file(name + ".report.json")
    log = ctx.actions.declare_file(name + ".log")
    timings = ctx.actions.declare_file(name + ".timings.json")
    files = {"artifact": artifact, "report": report, "log": log, "timings": timings}

    action = ctx.actions.args()
    action.add_all(["-B", "-P", "-s", ctx.file._action])
    action.add("--report", report)
    action.add("--log", log)
    action.add("--timings", timings)
    lower = ctx.actions.args()
    lower.add("--")
    lower.add(ctx.file.model)
    lower.add("--target", target)
    lower.add("--output", artifact)
    if target not in ("aten", "onnx"):
        files["tosa"] = ctx.actions.declare_file(name + ".tosa")
        lower.add("--tosa_output", files["tosa"])
        files["plot"] = ctx.actions.declare_file(name + ".error.png")  # beside the .pte
        action.add("--plot", files["plot"])
    if _is_npu(target):
        files["vela_summary"] = ctx.actions.declare_file(name + ".vela_summary.csv")
        lower.add("--vela_summary", files["vela_summary"])
    inputs = [ctx.file.model, ctx.file._action, ctx.file._import_root] + ctx.files._environment
    if ctx.file.calibration:
        inputs.append(ctx.file.calibration)
        lower.add("--calibration", ctx.file.calibration)
    lower.add_all(ctx.attr.options)

    # bazel/import_root: `recurrent_lowering` under any repository name.
    import_root = ctx.file._import_root.dirname.rpartition("/")[0]
    ctx.actions.run(
        executable = ctx.file._python,
        arguments = [action, lower],
        inputs = depset(inputs, transitive = [
            _route(ctx)[PyInfo].transitive_sources,
            _route(ctx)[DefaultInfo].default_runfiles.files,  # data: the cost model's constants
        ]),
        outputs = files.values(),
        mnemonic = "NpuLower",
        progress_message = "Lowering %s for %s" % (ctx.file.model.short_path, target),
        env = {
            "PYTHONPATH": import_root,
            "MPLBACKEND": "Agg",
            # One thread and ATen's baseline kernels: fp32 results (calibration ranges, the
            # numerics' reference) do not depend on the executing machine's cores or ISA.
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            "OPENBLAS_NUM_THREADS": "1",
            "ATEN_CPU_CAPABILITY": "default",
            "PYTHONHASHSEED": "0",
        },
        execution_requirements = {"block-network": ""},
    )
    outputs = [files[k] for k in ("artifact", "report", "tosa", "vela_summary", "plot") if k in files]
    groups = {k: depset([f]) for k, f in files.items()}
    groups["logs"] = depset([log, timings])
    return [
        # As runfiles too, so a test or binary with the model in `data` reads its files.
        DefaultInfo(files = depset(outputs), runfiles = ctx.runfiles(files = outputs)),
        NpuModelInfo(
            target = target,
            **{k: files.get(k) for k in ("artifact", "report", "tosa", "vela_summary", "plot", "log", "timings")}
        ),
        OutputGroupInfo(**groups),
    ]

def _py_route(label):
    return attr.label(default = Label(label), providers = [PyInfo])

npu_model = rule(
    implementation = _npu_model_impl,
    doc = "Lowers `model` for `target` with //tools:lower. Default outputs: the artifact, the " +
          "JSON report and, for TOSA/Ethos-U targets, the .tosa, the error plot (and Vela's " +
          "summary CSV); output groups name each (artifact, report, tosa, vela_summary, plot) " +
          "plus `logs` (the lowering's log and timings).",
    attrs = {
        "model": attr.label(allow_single_file = [".onnx", ".pt2"], mandatory = True),
        "target": attr.string(mandatory = True, doc = "a //tools:lower --target name"),
        "calibration": attr.label(allow_single_file = [".npz"]),
        "options": attr.string_list(doc = "further //tools:lower flags, e.g. --emission=loop"),
        "_python": attr.label(
            default = Label("@recurrent_lowering_python//:python3"),
            allow_single_file = True,
            executable = True,
            cfg = "exec",
        ),
        "_environment": attr.label(default = Label("@recurrent_lowering_python//:environment.txt"), allow_files = True),
        "_action": attr.label(default = Label("//tools:npu_action.py"), allow_single_file = True),
        "_import_root": attr.label(
            default = Label("//bazel/import_root:recurrent_lowering/__init__.py"),
            allow_single_file = True,
        ),
        "_route_onnx": _py_route("//tools:route_onnx"),
        "_route_aten": _py_route("//tools:route_aten"),
        "_route_npu_torch": _py_route("//tools:route_npu_torch"),
        "_route_npu_onnx": _py_route("//tools:route_npu_onnx"),
    },
)

def _npu_model_test_impl(ctx):
    report = ctx.attr.model[NpuModelInfo].report
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
        "#!/bin/sh\nexec %s -B -P -s %s %s %s\n" % (
            ctx.file._python.short_path,
            ctx.file._check.short_path,
            report.short_path,
            " ".join(limits),
        ),
        is_executable = True,
    )
    runfiles = ctx.runfiles(files = [report, ctx.file._python, ctx.file._check] + ctx.files._environment)
    return [DefaultInfo(executable = script, runfiles = runfiles)]

_npu_model_test = rule(
    implementation = _npu_model_test_impl,
    test = True,
    attrs = {
        "model": attr.label(mandatory = True, providers = [NpuModelInfo]),
        "min_sqnr_db": attr.string(),
        "max_abs_err": attr.string(),
        "max_cycles": attr.string(),
        "_python": attr.label(
            default = Label("@recurrent_lowering_python//:python3"),
            allow_single_file = True,
        ),
        "_environment": attr.label(default = Label("@recurrent_lowering_python//:environment.txt"), allow_files = True),
        "_check": attr.label(default = Label("//tools:check_report.py"), allow_single_file = True),
    },
)

def npu_model_test(name, model, size = "small", **kwargs):
    """A test of a lowered model's report: fails when it crosses a threshold.

    The thresholds: SQNR below `min_sqnr_db`, max abs error above `max_abs_err`, or NPU cycles
    above `max_cycles`. They are strings so decimals are exact (e.g. "1e-5"). The test reads
    one JSON file, so it is small unless `size` says otherwise.

    Args:
      name: the test's name.
      model: an npu_model target.
      size: the test size.
      **kwargs: min_sqnr_db, max_abs_err, max_cycles and the attributes of any test.
    """
    _npu_model_test(name = name, model = model, size = size, **kwargs)
