"""A consumer imports recurrent_lowering's core next to its own `tools` package."""

import unittest

from recurrent_lowering.passes import spec
from tools import greeting


class UsesCoreTest(unittest.TestCase):
    def test_own_tools_package_is_not_shadowed(self):
        self.assertEqual(greeting.OWNER, "consumer_example")

    def test_core_spec_describes_a_gru(self):
        layer = spec.RecurrentSpec(
            name="kws_gru", cell=spec.CellKind.GRU, input_size=8, hidden_size=16
        )
        self.assertEqual(layer.cell.num_gates, 3)
        self.assertEqual(layer.output_size, 16)


if __name__ == "__main__":
    unittest.main()
