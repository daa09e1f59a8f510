"""The targets the Arm adapter lowers for, importable without torch or ExecuTorch (the CLI
names them before it has captured other libraries' output)."""

TOSA_TARGETS = ("TOSA-1.0+FP", "TOSA-1.0+INT")
ETHOS_U_TARGETS = (
    "ethos-u55-32",
    "ethos-u55-64",
    "ethos-u55-128",
    "ethos-u55-256",
    "ethos-u65-256",
    "ethos-u65-512",
    "ethos-u85-128",
    "ethos-u85-256",
    "ethos-u85-512",
    "ethos-u85-1024",
    "ethos-u85-2048",
)
