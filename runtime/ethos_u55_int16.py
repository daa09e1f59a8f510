"""What an Ethos-U55/U65 computes for the int16 forms our programs hold, as Vela 5.1.0 programs
them: the numbers behind the report's int16 figures for those targets.

Nothing here runs an Ethos-U; the model below is read from Vela's source (its C++ core,
regor, which compiles every .tosa) and from what Vela writes, and is compared with the TOSA
reference model (tests/runtime/test_ethos_u55_int16.py; docs/precision.md, "What the
Ethos-U55 int16 figures rest on"):

- TABLE int16 -> int32 followed by ExecuTorch's RESCALE (2^30, >> 37): Vela fuses the pair
  into one native 16-bit interpolating LUT of 512 words, each the table entry in its low 16
  bits and the difference to the next entry in its high 16 (`lut_words`); the hardware
  takes the top 9 bits of x + 32768 as the index and the low 7 as the fraction. It equals
  TOSA's TABLE + RESCALE on every input if the LUT rounds `(slope * fraction + 64) >> 7`
  (`lut`), which Vela's design assumes and no public Arm document states.
- CONV2D int16 x int8: a 40-bit accumulator where TOSA has 48 (`ACCUMULATOR_BITS`), the
  rescale's multiplier and shift as given, rounding half up.
- MUL/ADD/SUB on int32 between RESCALEs: regor folds the RESCALEs into one 16-bit
  elementwise operation (`elementwise`), the input scales into its OPA/OPB scales (ADD/SUB),
  the output scale into its OFM scale, rounding half up, clipped to int16; what Vela wrote
  for each is read back from the command stream (`elementwise_ops`).
"""

from __future__ import annotations

import dataclasses

import numpy as np

ACCUMULATOR_BITS = 40  # an int16 x int8 convolution's accumulator on Ethos-U55/U65
LUT_BYTES = 2048  # 512 words: the int16 LUT Vela DMAs into the NPU


def lut_words(table: np.ndarray) -> np.ndarray:
    """The 512 little-endian words Vela writes for a 513-entry int16 TOSA table."""
    t = np.asarray(table, np.int64)
    if t.shape != (513,):
        raise ValueError(f"an int16 TOSA table has 513 entries, not {t.shape}")
    base = t[:512].astype(np.int16).view(np.uint16).astype(np.uint32)
    slope = (t[1:] - t[:512]).astype(np.int16).view(np.uint16).astype(np.uint32)
    return (base | (slope << 16)).astype("<u4")


def lut(x: np.ndarray, words: np.ndarray) -> np.ndarray:
    """The U55's int16 interpolating LUT on int16 `x`: base + ((slope * frac + 64) >> 7)."""
    u = np.asarray(x, np.int64) + 32768
    index, frac = u >> 7, u & 127
    base = (words[index] & 0xFFFF).astype(np.uint16).view(np.int16).astype(np.int64)
    slope = (words[index] >> 16).astype(np.uint16).view(np.int16).astype(np.int64)
    return np.clip(base + ((slope * frac + 64) >> 7), -32768, 32767).astype(np.int16)


def lut_offsets(read_only: bytes, table: np.ndarray) -> list[int]:
    """Where the LUT for `table` sits in the read-only data Vela wrote (every occurrence).
    The data may lack its trailing zero bytes (ExecuTorch keeps it as a numpy bytes scalar,
    which drops them): they are put back."""
    needle, found, start = lut_words(table).tobytes(), [], 0
    read_only = read_only + bytes(len(needle))
    while (k := read_only.find(needle, start)) >= 0:
        found.append(k)
        start = k + 1
    return found


# The registers of the U55/U65 command stream an elementwise operation reads (opcodes and
# fields of regor's architecture/ethosu65/ethos_u65_interface.hpp, which the U55 shares).
_OP_ELEMENTWISE = 0x006
_IFM_PRECISION, _IFM2_PRECISION, _OFM_PRECISION = 0x105, 0x185, 0x114
_IFM_ZERO_POINT, _IFM2_ZERO_POINT, _OFM_ZERO_POINT = 0x109, 0x189, 0x118
_ACTIVATION, _ACTIVATION_MIN, _ACTIVATION_MAX = 0x125, 0x126, 0x127
_OFM_SCALE, _OPA_SCALE, _OPB_SCALE = 0x4024, 0x4025, 0x4026
ELEMENTWISE_MODES = {0: "MUL", 1: "ADD", 2: "SUB"}  # of NPU_OP_ELEMENTWISE (and more)
ROUND_MODES = {0: "DBL", 1: "TRUNCATE", 2: "NATURAL"}
IFM_SCALE_MODES = {0: "OPA_OPB_16", 1: "OPA_32", 2: "OPB_32"}


@dataclasses.dataclass(frozen=True)
class Elementwise:
    """One NPU_OP_ELEMENTWISE as Vela's command stream programs it."""

    mode: str  # MUL, ADD, SUB
    bits: tuple  # (ifm, ifm2, ofm) precision in bits, all signed
    ifm_scale_mode: str  # OPA_OPB_16: each operand times a 16-bit scale (ADD/SUB)
    rounding: tuple  # (ifm, ofm) round modes
    opa: tuple  # (scale, shift) of the first operand (ADD/SUB only)
    opb: int  # scale of the second operand (ADD/SUB only)
    ofm: tuple  # (scale, shift) of the result
    zero_points: tuple  # (ifm, ifm2, ofm)
    activation: int  # 0: clip only; 16..: a LUT (TABLE_0..)
    clip: tuple  # (min, max) of the output


def command_stream(cmd_data: bytes) -> np.ndarray:
    """The register command stream in Vela's driver payload (`cmd_data` of its .npz): the
    words after the header word that gives their count. Trailing zero bytes are put back."""
    data = cmd_data + bytes(-len(cmd_data) % 4)
    words = np.frombuffer(data, "<u4")
    for k, w in enumerate(words):  # header tag 2: count in bits 16..31, its top in 8..15
        if w & 0xFF == 2 and (w >> 16) | (((w >> 8) & 0xFF) << 16) == len(words) - k - 1:
            return words[k + 1 :]
    raise ValueError("no command stream in the payload")


def elementwise_ops(cmd_data: bytes) -> list[Elementwise]:
    """Each elementwise operation of Vela's command stream, with the registers it reads
    (a register keeps its value until set again, so each op sees the last value written)."""
    words, regs, ops, k = command_stream(cmd_data), {}, [], 0
    while k < len(words):
        code, param = int(words[k]) & 0xFFFF, int(words[k]) >> 16
        payload = int(words[k + 1]) if code & 0x4000 else None
        k += 2 if code & 0x4000 else 1
        regs[code] = (param, payload)
        if code != _OP_ELEMENTWISE:
            continue
        ifm, ifm2, ofm = regs[_IFM_PRECISION][0], regs[_IFM2_PRECISION][0], regs[_OFM_PRECISION][0]
        if not (ifm & ifm2 & ofm & 1):
            raise ValueError("an unsigned elementwise operand")
        signed16 = lambda v: v - 0x10000 if v & 0x8000 else v  # noqa: E731
        opa, opb = regs.get(_OPA_SCALE, (0, 1)), regs.get(_OPB_SCALE, (0, 1))
        ops.append(
            Elementwise(
                mode=ELEMENTWISE_MODES.get(param, str(param)),
                bits=(8 << ((ifm >> 2) & 3), 8 << ((ifm2 >> 2) & 3), 8 << ((ofm >> 1) & 3)),
                ifm_scale_mode=IFM_SCALE_MODES[(ifm >> 8) & 3],
                rounding=(ROUND_MODES[ifm >> 14], ROUND_MODES[ofm >> 14]),
                opa=(opa[1], opa[0] & 0x3F),
                opb=opb[1],
                ofm=(regs[_OFM_SCALE][1], regs[_OFM_SCALE][0] & 0x3F),
                zero_points=tuple(
                    signed16(regs[r][0])
                    for r in (_IFM_ZERO_POINT, _IFM2_ZERO_POINT, _OFM_ZERO_POINT)
                ),
                activation=regs[_ACTIVATION][0] & 0x1F,
                clip=(signed16(regs[_ACTIVATION_MIN][0]), signed16(regs[_ACTIVATION_MAX][0])),
            )
        )
    return ops


def elementwise(op: Elementwise, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """What the NPU computes for `op` on int16 operands, before any LUT: the product (MUL)
    or each operand times its 16-bit scale summed (ADD/SUB, OPA_OPB_16), then times the OFM
    scale, shifted right rounding half up (NATURAL), clipped to the activation's range.
    The rounding is regor's own model of the hardware (its constant folding, `Scale` in
    compiler/graphir_optimiser.cpp); configurations our programs do not hold are refused."""
    if op.bits != (16, 16, 16) or op.zero_points != (0, 0, 0) or op.rounding[1] != "NATURAL":
        raise ValueError(f"not modelled: {op}")
    x, y = np.asarray(a, np.int64), np.asarray(b, np.int64)
    if op.mode == "MUL":
        acc = x * y
    elif op.mode in ("ADD", "SUB") and op.ifm_scale_mode == "OPA_OPB_16" and op.opa[1] == 0:
        acc = x * op.opa[0] + (y * op.opb if op.mode == "ADD" else -y * op.opb)
    else:
        raise ValueError(f"not modelled: {op}")
    scale, shift = op.ofm
    rounded = (acc * scale + ((1 << shift) >> 1)) >> shift
    return np.clip(rounded, max(op.clip[0], -32768), min(op.clip[1], 32767)).astype(np.int16)
