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
- MUL/ADD/SUB on int32 between RESCALEs: folded into 16-bit elementwise operations with
  the same arithmetic, or kept in int32.
"""

from __future__ import annotations

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
