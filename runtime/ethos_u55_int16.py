"""What an Ethos-U55/U65 computes for the int16 forms our programs hold, as Vela 5.1.0 programs
them: the numbers behind the report's int16 figures for those targets.

Nothing here runs an Ethos-U; the model below is read from Vela's source (its C++ core,
regor, which compiles every .tosa) and from what Vela writes, and is compared with the TOSA
reference model (tests/runtime/test_ethos_u55_int16.py, test_ethos_u55_int16_magnitude.py;
docs/precision.md, "What the Ethos-U55 int16 figures rest on"):

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
- RESCALEs regor cannot fold (unequal ADD input scales that are not 16-bit integers, a
  non-shift output scale of a 32-bit operation): a Cast to int32 and a 32-bit MUL by the
  multiplier; CLAMPs as 1x1 pools that clip; 32-bit ADD/SUB/MUL. `run` executes a whole
  command stream of ELEMENTWISE and 1x1 POOL operations (`operations`, `compute`).
- REDUCE_SUM (a TOSA REDUCE_SUM, or a mean: the sum and its RESCALE): a 1x1 POOL in mode
  SUM over the IFM's depth (regor's GenerateOperationCode; it transposes the reduced axis
  there), the exact sum times the OFM scale, rounded as its ROUND_MODE says.

`inventory` sorts every operation of a program's command stream by what the figure rests on
for it (`rests_on`: the CLI's numerics.hardware; benchmarks/u55_forms.py), and
`truncating_luts` rewrites a program as a LUT rounding down would compute it.
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


def lut(x: np.ndarray, words: np.ndarray, half: int = 64) -> np.ndarray:
    """The U55's int16 interpolating LUT on int16 `x`: base + ((slope * frac + 64) >> 7),
    the interpolation rounded half up (`half` 0: rounded down)."""
    u = np.asarray(x, np.int64) + 32768
    index, frac = u >> 7, u & 127
    base = (words[index] & 0xFFFF).astype(np.uint16).view(np.int16).astype(np.int64)
    slope = (words[index] >> 16).astype(np.uint16).view(np.int16).astype(np.int64)
    return np.clip(base + ((slope * frac + half) >> 7), -32768, 32767).astype(np.int16)


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


# --- The whole command stream -------------------------------------------------------------
#
# An int16 program with RESCALEs regor cannot fold (input scales of an ADD that are unequal
# and not 16-bit integers, output scales of an int32 result) runs as more operations than
# one per TOSA operator: `RewriteRescale` (compiler/graphir_optimiser.cpp) turns each such
# RESCALE into a Cast to int32 (an ADD of a scalar 0, unit scales) and a 32-bit MUL by the
# multiplier (a constant tensor) with OFM scale (1, shift); a CLAMP runs as a 1x1 average
# pool whose activation clips; a TABLE not fused into the op before it as a 1x1 pool with the
# LUT as its activation. `run` executes the command stream on its memory to follow such a
# program end to end; what each operation computes is regor's own model of the hardware
# (`Scale` and the constant folding `ConstPropBinEw` of compiler/graphir_optimiser.cpp: the
# exact product or scaled sum, times the OFM scale, rounded per ROUND_MODE, saturated), with
# two behaviours that regor relies on and no public document states: a 32-bit MUL keeps
# its whole 64-bit product before the OFM shift (regor's softmax and RewriteRescale
# depend on it), and ACTIVATION_MIN/MAX, 16-bit registers, do not clip a 32-bit OFM (regor
# writes the int16 range there for int32 results, which would otherwise be wrong).

_OP_POOL, _OP_DMA_START = 0x005, 0x010
_REG = {  # register name -> opcode (cmd0: 16-bit param; cmd1: 0x4000 | n, 32-bit payload)
    "IFM_PAD_TOP": 0x100,
    "IFM_PAD_LEFT": 0x101,
    "IFM_PAD_RIGHT": 0x102,
    "IFM_PAD_BOTTOM": 0x103,
    "IFM_DEPTH_M1": 0x104,
    "IFM_PRECISION": 0x105,
    "IFM_UPSCALE": 0x107,
    "IFM_ZERO_POINT": 0x109,
    "IFM_WIDTH0_M1": 0x10A,
    "IFM_HEIGHT0_M1": 0x10B,
    "IFM_REGION": 0x10F,
    "OFM_WIDTH_M1": 0x111,
    "OFM_HEIGHT_M1": 0x112,
    "OFM_DEPTH_M1": 0x113,
    "OFM_PRECISION": 0x114,
    "OFM_ZERO_POINT": 0x118,
    "OFM_WIDTH0_M1": 0x11A,
    "OFM_HEIGHT0_M1": 0x11B,
    "OFM_REGION": 0x11F,
    "KERNEL_WIDTH_M1": 0x120,
    "KERNEL_HEIGHT_M1": 0x121,
    "KERNEL_STRIDE": 0x122,
    "ACC_FORMAT": 0x124,  # 0: I32, 1: I40, 2: F16
    "ACTIVATION": 0x125,
    "ACTIVATION_MIN": 0x126,
    "ACTIVATION_MAX": 0x127,
    "SCALE_REGION": 0x129,
    "DMA0_SRC_REGION": 0x130,
    "DMA0_DST_REGION": 0x131,
    "IFM2_BROADCAST": 0x180,
    "IFM2_SCALAR": 0x181,
    "IFM2_PRECISION": 0x185,
    "IFM2_ZERO_POINT": 0x189,
    "IFM2_WIDTH0_M1": 0x18A,
    "IFM2_HEIGHT0_M1": 0x18B,
    "IFM2_REGION": 0x18F,
    "IFM_BASE0": 0x4000,
    "IFM_STRIDE_X": 0x4004,
    "IFM_STRIDE_Y": 0x4005,
    "IFM_STRIDE_C": 0x4006,
    "OFM_BASE0": 0x4010,
    "OFM_STRIDE_X": 0x4014,
    "OFM_STRIDE_Y": 0x4015,
    "OFM_STRIDE_C": 0x4016,
    "SCALE_BASE": 0x4022,
    "SCALE_LENGTH": 0x4023,
    "OFM_SCALE": 0x4024,
    "OPA_SCALE": 0x4025,
    "OPB_SCALE": 0x4026,
    "DMA0_SRC": 0x4030,
    "DMA0_DST": 0x4031,
    "DMA0_LEN": 0x4032,
    "IFM2_BASE0": 0x4080,
    "IFM2_STRIDE_X": 0x4084,
    "IFM2_STRIDE_Y": 0x4085,
    "IFM2_STRIDE_C": 0x4086,
}
ELEMENTWISE_ALL = {0: "MUL", 1: "ADD", 2: "SUB", 3: "MIN", 4: "MAX"}  # the rest: refused
POOL_MODES = {0: "MAX", 1: "AVERAGE", 2: "SUM"}  # SUM: regor's REDUCE_SUM, over the IFM depth


@dataclasses.dataclass(frozen=True)
class Operation:
    """One NPU operation (ELEMENTWISE or POOL) of the command stream with every register
    `run` reads: enough to say what it computes, and to pin it."""

    kind: str  # "ELEMENTWISE" or "POOL"
    mode: str  # MUL, ADD, SUB, MIN, MAX; AVERAGE, MAX (POOL)
    shape: tuple  # OFM (height, width, depth)
    bits: tuple  # (ifm, ifm2, ofm) precision in bits, all signed (ifm2 None for a POOL)
    ifm_scale_mode: str
    rounding: tuple  # (ifm, ofm) round modes
    opa: tuple | None  # (scale, shift): ELEMENTWISE ADD/SUB only (a MUL ignores it)
    opb: int | None
    ofm: tuple  # (scale, shift)
    zero_points: tuple  # (ifm, ifm2, ofm)
    activation: int  # 0: clip only; 16 + k: LUT TABLE_k
    clip: tuple  # (min, max) of ACTIVATION_MIN/MAX (not applied to a 32-bit OFM)
    ifm2: str | None  # "tensor", "scalar <value>", "broadcast <hwc>" (ELEMENTWISE only)
    operand_order: str | None  # "B": ifm op ifm2; "A": ifm2 op ifm (ELEMENTWISE only)
    kernel: tuple = (1, 1)  # POOL kernel (height, width)
    signed: bool = True  # every operand and the result signed (else `compute` refuses it)

    @property
    def signature(self) -> tuple:
        """What fixes the arithmetic (not where it reads and writes, nor its shape)."""
        return tuple(getattr(self, name) for name in _ARITHMETIC)


_ARITHMETIC = [f.name for f in dataclasses.fields(Operation) if f.name != "shape"]


def _signed(value: int, bits: int) -> int:
    value &= (1 << bits) - 1
    return value - (1 << bits) if value >> (bits - 1) else value


class _Registers:
    def __init__(self):
        self.values: dict = {}

    def param(self, name: str) -> int:
        return self.values.get(_REG[name], (0, 0))[0]

    def payload(self, name: str) -> int:
        return self.values.get(_REG[name], (0, 0))[1]

    def precision(self, name: str, ofm: bool = False) -> tuple:
        """(bits, signed, nhcwb16, scale mode, round mode) of an IFM/IFM2/OFM precision."""
        p = self.param(name)
        bits = 8 << ((p >> 1) & 3 if ofm else (p >> 2) & 3)
        return bits, bool(p & 1), ((p >> 6) & 3) == 1, (p >> 8) & 3, p >> 14


def _operation(regs: _Registers, opcode: int, param: int) -> Operation:
    ifm = regs.precision("IFM_PRECISION")
    ofm = regs.precision("OFM_PRECISION", ofm=True)
    shape = tuple(regs.param(f"OFM_{d}_M1") + 1 for d in ("HEIGHT", "WIDTH", "DEPTH"))
    if opcode == _OP_ELEMENTWISE:
        ifm2 = regs.precision("IFM2_PRECISION")
        broadcast = regs.param("IFM2_BROADCAST")
        if broadcast & 0x80:
            how = f"scalar {_signed(regs.param('IFM2_SCALAR'), 16)}"
        elif broadcast & 7:
            how = "broadcast " + "".join(d for k, d in enumerate("hwc") if broadcast >> k & 1)
        else:
            how = "tensor"
        order = "A" if broadcast & 0x40 else "B"
        mode, bits2 = ELEMENTWISE_ALL.get(param, str(param)), ifm2[0]
        zp2 = _signed(regs.param("IFM2_ZERO_POINT"), 16)
        signed = ifm[1] and ifm2[1] and ofm[1]
    else:
        how, order, mode, bits2, zp2 = None, None, POOL_MODES.get(param, str(param)), None, None
        signed = ifm[1] and ofm[1]
    opa, ofm_scale = regs.values.get(_REG["OPA_SCALE"], (0, 1)), regs.values.get(_REG["OFM_SCALE"])
    kernel = (regs.param("KERNEL_HEIGHT_M1") + 1, regs.param("KERNEL_WIDTH_M1") + 1)
    return Operation(
        kind="ELEMENTWISE" if opcode == _OP_ELEMENTWISE else "POOL",
        mode=mode,
        shape=shape,
        bits=(ifm[0], bits2, ofm[0]),
        ifm_scale_mode=IFM_SCALE_MODES.get(ifm[3], str(ifm[3])),
        rounding=(ROUND_MODES[ifm[4]], ROUND_MODES[ofm[4]]),
        opa=(opa[1], opa[0] & 0x3F) if mode in ("ADD", "SUB") and how is not None else None,
        opb=regs.values.get(_REG["OPB_SCALE"], (0, 1))[1]
        if mode in ("ADD", "SUB") and how is not None
        else None,
        ofm=(ofm_scale[1], ofm_scale[0] & 0x3F),
        zero_points=(
            _signed(regs.param("IFM_ZERO_POINT"), 16),
            zp2,
            _signed(regs.param("OFM_ZERO_POINT"), 16),
        ),
        activation=regs.param("ACTIVATION") & 0x1F,
        clip=(_signed(regs.param("ACTIVATION_MIN"), 16), _signed(regs.param("ACTIVATION_MAX"), 16)),
        ifm2=how,
        operand_order=order,
        kernel=kernel if opcode == _OP_POOL else (1, 1),
        signed=signed,
    )


def operations(cmd_data: bytes) -> list[Operation]:
    """Every ELEMENTWISE and POOL operation of Vela's command stream, in order."""
    return [op for op, _ in _walk(cmd_data) if isinstance(op, Operation)]


def _walk(cmd_data: bytes):
    """(Operation, registers) for each ELEMENTWISE / POOL, (None, registers) for each
    DMA_START and ("CONV", registers) for each convolution, in order."""
    words, regs, k = command_stream(cmd_data), _Registers(), 0
    while k < len(words):
        code, param = int(words[k]) & 0xFFFF, int(words[k]) >> 16
        long = bool(code & 0x4000)
        payload = int(words[k + 1]) if long else None
        k += 2 if long else 1
        if long or code >= 0x100:
            regs.values[code] = (param, payload)
        elif code in (_OP_ELEMENTWISE, _OP_POOL):
            yield _operation(regs, code, param), regs
        elif code == _OP_DMA_START:
            yield None, regs
        elif code in (0x002, 0x003):
            yield "CONV", regs


def scaled(acc, scale: int, shift: int, rounding: str):
    """acc * scale, shifted right by `shift` rounding as ROUND_MODE says (regor's `Scale`):
    NATURAL half up; DBL half up plus 2^30 away from zero when shift > 31; TRUNCATE toward
    zero. Exact integers (numpy object arrays or int64 that cannot overflow)."""
    v = acc * scale
    if shift == 0:
        return v
    if rounding == "TRUNCATE":
        return np.where(v >= 0, v >> shift, -((-v) >> shift))
    half = 1 << (shift - 1)
    if rounding == "DBL" and shift > 31:
        return (v + half + np.where(v >= 0, 1 << 30, -(1 << 30))) >> shift
    return (v + half) >> shift


def compute(op: Operation, a, b=None, lut_words: np.ndarray | None = None) -> np.ndarray:
    """What the NPU computes for `op` on its operands (as read, before zero points): the
    product, the OPA/OPB-scaled sum or difference, min or max (ELEMENTWISE), the value
    (a 1x1 POOL) or its sum over the last axis (SUM), times the OFM scale, rounded, plus
    the OFM zero point, saturated to the OFM's bits, then the LUT (activation TABLE_k) and
    the ACTIVATION_MIN/MAX clip (an 8/16-bit OFM only). Configurations our programs do not
    hold are refused."""
    if op.rounding[1] not in ("NATURAL", "DBL", "TRUNCATE"):
        raise ValueError(f"not modelled: {op}")
    if not op.signed:
        raise ValueError(f"not modelled (an unsigned operand): {op}")
    x = np.asarray(a, np.int64).astype(object) - op.zero_points[0]
    if op.kind == "POOL":
        if op.kernel != (1, 1) or op.mode not in ("AVERAGE", "MAX", "SUM"):
            raise ValueError(f"not modelled: {op}")
        acc = x.sum(axis=-1, keepdims=True) if op.mode == "SUM" else x
    else:
        y = np.asarray(b, np.int64).astype(object) - op.zero_points[1]
        if op.operand_order == "A":
            x, y = y, x
        if op.mode == "MUL":
            acc = x * y
        elif op.mode in ("ADD", "SUB"):
            if op.ifm_scale_mode != "OPA_OPB_16" or op.opa[1] != 0:
                raise ValueError(f"not modelled (advanced IFM scaling): {op}")
            acc = x * op.opa[0] + (y if op.mode == "ADD" else -y) * op.opb
        elif op.mode in ("MIN", "MAX"):
            acc = np.minimum(x, y) if op.mode == "MIN" else np.maximum(x, y)
        else:
            raise ValueError(f"not modelled: {op}")
    bits = op.bits[2]
    v = scaled(acc, op.ofm[0], op.ofm[1], op.rounding[1]) + op.zero_points[2]
    v = np.clip(v, -(1 << (bits - 1)), (1 << (bits - 1)) - 1).astype(np.int64)
    if op.activation >= 16:
        if bits != 16 or lut_words is None:
            raise ValueError(f"not modelled: a LUT on {op}")
        v = lut(v, lut_words).astype(np.int64)
    elif op.activation != 0:
        raise ValueError(f"not modelled: activation {op.activation}")
    if bits <= 16:
        v = np.clip(v, op.clip[0], op.clip[1])
    return v


class _Memory:
    """Byte arrays per region, grown on demand."""

    def __init__(self):
        self.regions: dict = {}

    def _region(self, region: int, end: int) -> bytearray:
        mem = self.regions.setdefault(region, bytearray())
        if len(mem) < end:
            mem.extend(bytes(end - len(mem)))
        return mem

    def write(self, region: int, address: int, data: bytes):
        self._region(region, address + len(data))[address : address + len(data)] = data

    def read(self, region: int, address: int, length: int) -> bytes:
        return bytes(self._region(region, address + length)[address : address + length])


_DTYPES = {8: "<i1", 16: "<i2", 32: "<i4"}


def weight_data(npz) -> tuple:
    """(region, bytes) of the weight data in Vela's .npz (loaded), as `inventory` and
    `convolutions` take it."""
    return int(npz["weight_region"]), bytes(npz["weight_data"].item())


def _memory(weights: tuple) -> _Memory:
    """Memory holding the weight data (`weight_data`), as the program starts."""
    memory = _Memory()
    memory.write(weights[0], 0, weights[1])
    return memory


def _dma(memory: _Memory, regs: _Registers, shram: dict):
    """A DMA_START: constant memory -> SHRAM (a LUT, kept in `shram` by address) or another
    region."""
    src, dst = regs.param("DMA0_SRC_REGION"), regs.param("DMA0_DST_REGION")
    data = memory.read(src & 7, regs.payload("DMA0_SRC"), regs.payload("DMA0_LEN"))
    if dst >> 8 & 1:
        shram[regs.payload("DMA0_DST")] = data
    else:
        memory.write(dst & 7, regs.payload("DMA0_DST"), data)


def _addresses(shape, base, strides, nhcwb16, elem) -> np.ndarray:
    """Byte address of each (h, w, c) element of a feature map (regor's NHWC / NHCWB16)."""
    h, w, c = np.meshgrid(*(np.arange(n) for n in shape), indexing="ij")
    sy, sx, sc = strides
    if nhcwb16:
        return base + h * sy + w * sx + (c // 16) * sc + (c % 16) * elem
    return base + h * sy + w * sx + c * sc


def _feature_map(regs: _Registers, prefix: str, shape, bits: int, nhcwb16: bool):
    if (
        regs.param(f"{prefix}_HEIGHT0_M1") + 1 < shape[0]
        or regs.param(f"{prefix}_WIDTH0_M1") + 1 < shape[1]
    ):
        raise ValueError(f"{prefix}: more than one tile, not modelled")
    strides = tuple(regs.payload(f"{prefix}_STRIDE_{d}") for d in "YXC")
    addresses = _addresses(shape, regs.payload(f"{prefix}_BASE0"), strides, nhcwb16, bits // 8)
    return regs.param(f"{prefix}_REGION") & 7, addresses


def _load(memory: _Memory, region: int, addresses: np.ndarray, bits: int) -> np.ndarray:
    size = bits // 8
    top = int(addresses.max()) + size
    data = np.frombuffer(memory.read(region, 0, top), np.uint8)
    index = addresses[..., None] + np.arange(size)
    return data[index].copy().view(_DTYPES[bits])[..., 0].astype(np.int64)


def _store(memory: _Memory, region: int, addresses: np.ndarray, bits: int, values: np.ndarray):
    size = bits // 8
    top = int(addresses.max()) + size
    data = bytearray(memory.read(region, 0, top))
    raw = np.asarray(values, np.int64).astype(_DTYPES[bits]).view(np.uint8).reshape(-1, size)
    flat = np.frombuffer(data, np.uint8).copy()
    flat[(addresses.reshape(-1, 1) + np.arange(size)).ravel()] = raw.ravel()
    memory.write(region, 0, flat.tobytes())


def run(npz, inputs, trace: list | None = None, model=None) -> list[np.ndarray]:
    """Vela's program (`npz`: its out_vela.npz, loaded) on int16 `inputs`, as the model
    computes each operation: the outputs, each in the shape and type Vela gives it. With
    `trace` a list, (Operation, IFM, IFM2 or None, OFM values) of each operation is
    appended to it. `model` (default `compute`) computes each operation."""
    model = model or compute
    memory = _memory(weight_data(npz))
    for k, value in enumerate(inputs):
        size = int(npz["input_elem_size"][k])
        data = np.ascontiguousarray(np.asarray(value).astype(_DTYPES[8 * size])).tobytes()
        memory.write(int(npz["input_region"][k]), int(npz["input_offset"][k]), data)
    shram_luts: dict = {}  # SHRAM address -> the bytes last DMA'd there
    for op, regs in _walk(bytes(npz["cmd_data"].item())):
        if isinstance(op, str):
            raise ValueError("a convolution: not modelled by run")
        if op is None:
            _dma(memory, regs, shram_luts)
            continue
        ifm_p = regs.precision("IFM_PRECISION")
        ofm_p = regs.precision("OFM_PRECISION", ofm=True)
        if op.kind == "POOL" and any(
            regs.param(f"IFM_PAD_{s}") for s in ("TOP", "LEFT", "RIGHT", "BOTTOM")
        ):
            raise ValueError("a padded pool: not modelled")
        if op.kind == "POOL" and regs.param("KERNEL_STRIDE") & 0x3:
            raise ValueError("a strided pool: not modelled")
        if regs.param("IFM_UPSCALE"):
            raise ValueError("IFM upscaling: not modelled")
        shape = op.shape
        if op.mode == "SUM":  # over the IFM's depth, into an OFM of depth 1
            shape = (*op.shape[:2], regs.param("IFM_DEPTH_M1") + 1)
        region, where = _feature_map(regs, "IFM", shape, op.bits[0], ifm_p[2])
        a = _load(memory, region, where, op.bits[0])
        b = None
        if op.kind == "ELEMENTWISE":
            if op.ifm2.startswith("scalar"):
                b = np.full(op.shape, int(op.ifm2.split()[1]), np.int64)
            else:
                flags = op.ifm2.split()[1] if op.ifm2.startswith("broadcast") else ""
                shape2 = tuple(1 if d in flags else n for d, n in zip("hwc", op.shape))
                ifm2_p = regs.precision("IFM2_PRECISION")
                region2, where2 = _feature_map(regs, "IFM2", shape2, op.bits[1], ifm2_p[2])
                b = np.broadcast_to(_load(memory, region2, where2, op.bits[1]), op.shape)
        words = None
        if op.activation >= 16:
            luts = [v for v in shram_luts.values() if len(v) == LUT_BYTES]
            if op.activation != 16 or len(shram_luts) != 1 or not luts:
                raise ValueError("a LUT other than one 16-bit table in SHRAM: not modelled")
            words = np.frombuffer(luts[0], "<u4")
        values = model(op, a, b, words)
        region, where = _feature_map(regs, "OFM", op.shape, op.bits[2], ofm_p[2])
        _store(memory, region, where, op.bits[2], values)
        if trace is not None:
            trace.append((op, a, b, values))
    outputs = []
    for k in range(len(npz["output_offset"])):
        shape = tuple(int(n) for n in npz["output_shape"][k])
        size = int(npz["output_elem_size"][k])
        raw = memory.read(
            int(npz["output_region"][k]), int(npz["output_offset"][k]), size * int(np.prod(shape))
        )
        outputs.append(np.frombuffer(raw, _DTYPES[8 * size]).reshape(shape).copy())
    return outputs


def differing(npz, tosa, feeds) -> tuple[int, int]:
    """(outputs where `run` differs from the TOSA reference model on `tosa`, outputs in all)
    over `feeds`, each a list of int16 inputs: Vela's program as modelled against the
    program it compiled."""
    from . import tosa_reference

    differ, total = 0, 0
    for feed in feeds:
        for want, got in zip(tosa_reference.run(tosa, feed), run(npz, feed)):
            differ += int(np.sum(got.reshape(want.shape) != want))
            total += want.size
    return differ, total


# --- What a program's figure rests on ------------------------------------------------------
#
# Each NPU operation of a command stream, classified by what the TOSA reference model's
# figure rests on for it on Ethos-U55/U65 (benchmarks/u55_forms.py tabulates real programs).

INT8 = "int8"  # every operand and the result 8-bit: Vela's int8 forms, not in question here
CONV16 = "int16 convolution"  # equal while the 40-bit accumulator holds (accumulator_bits)
MODELLED = "16-bit"  # ELEMENTWISE / 1x1 POOL the model computes, nothing wider than 16 bits
WIDE = "32-bit"  # a 32-bit operand or result: rests on the whole product, an unclipped OFM
NOT_MODELLED = "not modelled"  # what `compute` refuses
# Any operation with a 16-bit result may carry a 16-bit LUT as its activation, which rests
# on the LUT's rounding.


def describe(op: Operation) -> str:
    """The arithmetic of `op` in one line (not where it reads or writes, nor its shape)."""
    bits = "/".join(f"i{b}" for b in op.bits if b) if op.bits[1] else f"i{op.bits[0]}>i{op.bits[2]}"
    text = f"{op.kind[:4]} {op.mode} {bits} ofm{op.ofm} {op.rounding[1]}"
    if op.opa is not None:
        text += f" {op.ifm_scale_mode} opa{op.opa} opb {op.opb}"
    if op.ifm2 is not None:
        text += f" ifm2 {op.ifm2}" + (" reversed" if op.operand_order == "A" else "")
    if op.kernel != (1, 1):
        text += f" kernel{op.kernel}"
    if not op.signed:
        text += " unsigned"
    if op.activation:
        text += f" LUT{op.activation - 16}"
    if op.bits[2] <= 16 and op.clip != (-32768, 32767):
        text += f" clip{op.clip}"
    return text


def standing(op: Operation) -> str:
    """What the report's figure rests on for `op` (one of the constants above)."""
    bits = [b for b in op.bits if b]
    if max(bits) <= 8:
        return INT8
    try:
        operands = [np.zeros(1, np.int64)] * (2 if op.kind == "ELEMENTWISE" else 1)
        words = np.zeros(512, np.uint32) if op.activation >= 16 else None
        compute(op, *operands, lut_words=words)
    except ValueError:
        return NOT_MODELLED
    return WIDE if max(bits) > 16 else MODELLED


def inventory(cmd_data: bytes, weights: tuple | None = None):
    """(standing, LUT, form, int16) of each NPU operation of the command stream, in order:
    ELEMENTWISE and POOL by `standing` and `describe`, a convolution as INT8 or CONV16 by its
    IFM; LUT True where a 16-bit LUT is its activation; int16 True where an operand or the
    result is 16-bit (a program without any is an int8 one, whose forms are not in question
    here). With `weights` (region, bytes: Vela's weight_data), an int8 convolution with a
    32-bit result is WIDE where its scale stream holds unit scales (`Convolution`)."""
    known: dict = {}
    memory = _memory(weights) if weights is not None else None
    for op, regs in _walk(cmd_data):
        if op is None:
            if memory is not None:
                _dma(memory, regs, {})
            continue
        if isinstance(op, str):
            ifm = regs.precision("IFM_PRECISION")[0]
            ofm = regs.precision("OFM_PRECISION", ofm=True)[0]
            kernel = (regs.param("KERNEL_HEIGHT_M1") + 1, regs.param("KERNEL_WIDTH_M1") + 1)
            lut = regs.param("ACTIVATION") & 0x1F >= 16 and ofm == 16
            form = f"{op} i{ifm}>i{ofm} kernel{kernel}" + (" LUT" if lut else "")
            standing_ = CONV16 if ifm == 16 else INT8 if ofm == 8 else NOT_MODELLED
            if (ifm, ofm) == (8, 32) and memory is not None:
                if _convolution(memory, regs).unit_scales:
                    standing_, form = WIDE, form + " unit scales"
            yield standing_, lut, form, 16 in (ifm, ofm)
            continue
        if op.signature not in known:  # a loop form repeats a few forms thousands of times
            known[op.signature] = standing(op), describe(op)
        lut = op.activation >= 16 and op.bits[2] == 16
        yield known[op.signature][0], lut, known[op.signature][1], 16 in op.bits


@dataclasses.dataclass(frozen=True)
class Convolution:
    """One convolution command with its scale stream: (bias, scale, shift) per OFM channel,
    the 10-byte records regor's EthosU55WeightEncoder writes (EncodeBias: a 40-bit bias, a
    32-bit scale, a 6-bit shift), read where SCALE_BASE points once the DMAs before it ran."""

    bits: tuple  # (ifm, ofm)
    accumulator: int  # ACC_FORMAT: 0 I32, 1 I40, 2 F16
    activation: int
    bias: np.ndarray
    scale: np.ndarray
    shift: np.ndarray

    @property
    def unit_scales(self) -> bool:
        """Whether it writes its 32-bit accumulator plus bias as is (every channel at scale
        (1, 0), no activation): then an int8 convolution to int32 equals TOSA's int8 CONV2D
        exactly, if the NPU does not clip a 32-bit OFM to ACTIVATION_MIN/MAX (WIDE's
        assumption)."""
        return bool(
            self.accumulator == 0
            and self.activation == 0
            and np.all(self.scale == 1)
            and np.all(self.shift == 0)
        )


def _convolution(memory: _Memory, regs: _Registers) -> Convolution:
    depth = regs.param("OFM_DEPTH_M1") + 1
    data = memory.read(regs.param("SCALE_REGION") & 7, regs.payload("SCALE_BASE"), 10 * depth)
    records = np.frombuffer(data, np.uint8).reshape(depth, 10).astype(np.int64)
    bias = sum(records[:, k] << (8 * k) for k in range(5))
    return Convolution(
        bits=(regs.precision("IFM_PRECISION")[0], regs.precision("OFM_PRECISION", ofm=True)[0]),
        accumulator=regs.param("ACC_FORMAT"),
        activation=regs.param("ACTIVATION") & 0x1F,
        bias=np.where(bias >= 1 << 39, bias - (1 << 40), bias),
        scale=sum(records[:, 5 + k] << (8 * k) for k in range(4)),
        shift=records[:, 9] & 0x3F,
    )


def convolutions(cmd_data: bytes, weights: tuple) -> list[Convolution]:
    """Each convolution of the command stream with its scale stream, in order; `weights`
    (region, bytes) is Vela's weight_data."""
    memory, found = _memory(weights), []
    for op, regs in _walk(cmd_data):
        if op is None:
            _dma(memory, regs, {})
        elif op == "CONV":
            found.append(_convolution(memory, regs))
    return found


_CONVOLUTIONS = {"CONV2D": (1, 2, 3), "DEPTHWISE_CONV2D": (0, 1), "TRANSPOSE_CONV2D": (1, 2, 3)}


def accumulator_bits(tosa) -> int | None:
    """The most bits any int16 convolution of the TOSA graph (`tosa`: bytes or path) needs
    for its accumulator over every int16 input (sum of |weight| times 2^15, plus |bias|,
    signed); None if it has none. Equal to TOSA's 48-bit result while <= ACCUMULATOR_BITS."""
    from . import tosa_flatbuffer as tf

    buf = tf.load_bytes(tosa)
    block = tf.main_block(buf)
    types = {}
    wanted = []
    for o in range(block.OperatorsLength()):
        op = block.Operators(o)
        name = tf.op_name(op.Op())
        if name in _CONVOLUTIONS:
            wanted.append((name, [op.Inputs(k).decode() for k in range(3)]))
    if not wanted:
        return None
    names = {n for _, inputs in wanted for n in inputs}
    for i in range(block.TensorsLength()):
        t = block.Tensors(i)
        name = t.Name().decode()
        if name in names:
            shape = tuple(int(d) for d in t.ShapeAsNumpy()) if t.ShapeLength() else ()
            dtype = tf.dtype_name(t.Type())
            types[name] = (dtype, shape, t)
    worst = None
    for kind, (x, w, b) in wanted:
        if types[x][0] != "INT16":
            continue
        weights = tf.decode(types[w][2].DataAsNumpy(), types[w][0], int(np.prod(types[w][1])))
        weights = np.abs(weights.reshape(types[w][1]).astype(np.int64))
        bias = tf.decode(types[b][2].DataAsNumpy(), types[b][0], int(np.prod(types[b][1])))
        total = weights.sum(axis=_CONVOLUTIONS[kind]).reshape(-1)
        reach = int(total.max()) * (1 << 15) + int(np.abs(bias.astype(np.int64)).max(initial=0))
        bits = reach.bit_length() + 1
        worst = bits if worst is None else max(worst, bits)
    return worst


def truncating_luts(flatbuffer: bytes) -> bytes:
    """The program as a U55 whose LUT rounded its interpolation down would compute it: 64
    subtracted between each int16 TABLE and the RESCALE (2^30, >> 37) Vela fuses with it
    (`lut`), which turns that RESCALE's half-up rounding of v / 2^7 into a floor. What the
    report's figure would be if the one LUT behaviour no public document states went the
    other way (stream_attribution.py --tosa --lut_down; docs/precision.md)."""
    import dataclasses as dc

    import tosa_serializer as ts

    from . import tosa_copy, tosa_pieces

    def _value(t):
        return tosa_copy.values(t.data, t.dtype, 1)[0]

    graph = tosa_copy.load(flatbuffer)
    if len(graph.regions) != 1 or len(graph.regions[0].basicBlocks) != 1:
        raise ValueError("a TOSA graph of more than one block")
    block = graph.regions[0].basicBlocks[0]
    tensors, shapes = tosa_pieces.read_tensors(flatbuffer)
    operators = list(block.operators)
    tables = {
        op.outputs[0]
        for op in operators
        if op.op == ts.Op.TABLE and tensors[op.inputs[0]].dtype == ts.DType.INT16
    }

    @dc.dataclass
    class _Op:
        op: object
        inputs: list
        outputs: list
        attributes: object

    def new(kind, inputs, outputs, attribute, *args):
        attr = ts.TosaSerializerAttribute()
        getattr(attr, attribute)(*args)
        return _Op(kind, inputs, outputs, attr)

    rewritten = []
    for op in operators:
        if any(name in tables for name in op.inputs):
            if op.op != ts.Op.RESCALE:
                raise ValueError(f"an int16 TABLE read by {op.op}, not a RESCALE")
            m, shift = (int(_value(tensors[n])) for n in op.inputs[1:3])
            if (m, shift) != (1 << 30, 37):
                raise ValueError(f"an int16 TABLE's RESCALE ({m}, {shift}), not (2^30, 37)")
            source = op.inputs[0]
            value, down = f"{source}_half", f"{source}_down"
            rank = len(tensors[source].shape)
            tensors[value] = tosa_pieces.Tensor(
                [1] * rank, ts.DType.INT32, np.array([-64], "<i4").view(np.uint8)
            )
            tensors[down] = tosa_pieces.Tensor(tensors[source].shape, ts.DType.INT32, None)
            rewritten.append(new(ts.Op.CONST, [], [value], "ConstAttribute"))
            rewritten.append(new(ts.Op.ADD, [source, value], [down], "AddAttribute"))
            op = _Op(op.op, [down, *list(op.inputs)[1:]], list(op.outputs), op.attributes)
        rewritten.append(op)
    return tosa_pieces.write(
        tensors, shapes, rewritten, range(len(rewritten)), list(block.inputs), list(block.outputs)
    )


def rests_on(npz_files, tosa_files) -> dict | None:
    """What an Ethos-U55/U65 program's TOSA-reference figure rests on, from Vela's outputs
    (`npz_files`, one per delegate) and the .tosa it compiled: operations per standing,
    how many carry a 16-bit LUT, the int16 convolutions' worst-case accumulator bits, and
    the behaviours the figure assumes (`assumes`). None for a program without int16."""
    counts, luts, int16 = dict.fromkeys((INT8, CONV16, MODELLED, WIDE, NOT_MODELLED), 0), 0, 0
    for path in npz_files:
        with np.load(path) as npz:
            cmd_data = bytes(npz["cmd_data"].item())
            weights = weight_data(npz)
        for standing, lut, _, sixteen in inventory(cmd_data, weights):
            counts[standing] += 1
            luts += lut
            int16 += sixteen
    if not int16:
        return None
    bits = [b for b in map(accumulator_bits, tosa_files) if b is not None]
    worst = max(bits) if bits else None
    assumes = []
    if luts:
        assumes.append("the LUT rounds its interpolation half up")
    if counts[WIDE]:
        assumes.append("a 32-bit MUL keeps its whole product; a 32-bit OFM is not clipped")
    return {
        "operations": counts,
        "lut_operations": luts,
        "accumulator_bits": worst,
        "accumulator_fits": worst is None or worst <= ACCUMULATOR_BITS,
        "assumes": assumes,
    }
