"""Small TOSA graphs written with tosa_serializer, for tests that run one operator form on
the TOSA reference model."""

import numpy as np
import tosa_serializer as ts


def attribute(kind, *args):
    attr = ts.TosaSerializerAttribute()
    getattr(attr, kind)(*args)
    return attr


def const(block, name, shape, dtype, values):
    block.addTensor(name, shape, dtype, np.asarray(values))
    block.addOperator(ts.Op.CONST, [], [name], attribute("ConstAttribute"))


def rescale(block, x, y, shape, dtypes, multiplier, shift, zero_points=(0, 0)):
    """y = RESCALE(x) by `multiplier` and `shift`, single round, with `zero_points` (x's,
    y's); `dtypes` are x's and y's."""
    const(block, y + "_m", [1], ts.DType.INT32, [multiplier])
    const(block, y + "_s", [1], ts.DType.INT8, [shift])
    const(block, y + "_zi", [1], dtypes[0], [zero_points[0]])
    const(block, y + "_zo", [1], dtypes[1], [zero_points[1]])
    block.addTensor(y, shape, dtypes[1])
    single = attribute("RescaleAttribute", True, ts.RoundingMode.SINGLE_ROUND, False, False, False)
    block.addOperator(ts.Op.RESCALE, [x, y + "_m", y + "_s", y + "_zi", y + "_zo"], [y], single)
