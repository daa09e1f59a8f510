"""Vela summary / per-layer CSV parsing on files Vela 5.1.0 wrote here (tiny_gru, INT8, U55-128),
and the Vela command line."""

import dataclasses
import pathlib

import pytest

from recurrent_lowering.runtime import vela

DATA = pathlib.Path(__file__).parent / "testdata"
SUMMARY = DATA / "tiny_gru_int_summary_Ethos_U55_High_End_Embedded.csv"
PER_LAYER = DATA / "tiny_gru_int_per-layer.csv"


def test_summary_fields():
    s = vela.parse_summary_csv(SUMMARY)
    assert (s.accelerator, s.system_config, s.memory_mode) == (
        "Ethos_U55_128",
        "Ethos_U55_High_End_Embedded",
        "Shared_Sram",
    )
    assert s.cycles == 10579 and s.cycles_npu == 4617
    # inference time is cycles at the 500 MHz core clock
    assert s.inference_time_s == pytest.approx(s.cycles / s.core_clock_hz)
    assert s.sram_used_bytes == 208  # Vela writes KiB (0.203125)
    assert s.off_chip_flash_used_bytes == 8368
    assert s.off_chip_flash_traffic_bytes == 8864
    assert s.nn_macs == 4064
    assert s.mac_utilisation == pytest.approx(4064 / (10579 * 128))
    assert s.cycles_by_kind["cycles_off_chip_flash_access"] == 8864


def test_per_layer_table_adds_up_to_summary():
    ops = vela.parse_per_layer_csv(PER_LAYER)
    summary = vela.parse_summary_csv(SUMMARY)
    assert len(ops) == 59
    assert sum(op.cycles for op in ops) == summary.cycles
    assert sum(op.mac_count for op in ops) == summary.nn_macs
    first = ops[0]
    assert (first.original_op, first.npu_op, first.target) == ("Conv2D", "Conv2D", "NPU")
    assert (first.cycles, first.mac_count, first.name) == (1040, 384, "tosa_rescale_default_1")


def test_not_a_summary_is_rejected(tmp_path):
    bad = tmp_path / "x.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(vela.VelaError, match="not a Vela summary"):
        vela.parse_summary_csv(bad)


def test_vela_args_use_target_defaults():
    args = vela.vela_args("m.tosa", "/tmp/o", "ethos-u85-256")
    assert "--accelerator-config=ethos-u85-256" in args
    assert "--system-config=Ethos_U85_SYS_DRAM_Mid" in args
    assert "--memory-mode=Sram_Only" in args
    assert "--verbose-performance" in args and args[-1] == "m.tosa"
    custom = vela.vela_args("m.tosa", "/o", "ethos-u55-128", memory_mode="Sram_Only")
    assert "--memory-mode=Sram_Only" in custom


def test_unknown_accelerator():
    with pytest.raises(ValueError, match="ethos-u99-1"):
        vela.default_config("ethos-u99-1")


def test_delegates_combine_by_sum_and_peak(tmp_path):
    """Two delegates run one after the other: time, cycles, MACs and flash add up, the SRAM
    arena is reused (peak), and the per-op rows of both are kept."""
    one = vela.VelaResult(
        vela.parse_summary_csv(SUMMARY), vela.parse_per_layer_csv(PER_LAYER), tmp_path, "a"
    )
    bigger_sram = dataclasses.replace(one.summary, sram_used_bytes=1000, cycles=1)
    two = vela.VelaResult(bigger_sram, one.ops[:3], tmp_path, "b")
    both = vela.combined([one, two], tmp_path)
    assert both.summary.cycles == 10579 + 1
    assert both.summary.nn_macs == 2 * 4064
    assert both.summary.off_chip_flash_used_bytes == 2 * 8368
    assert both.summary.sram_used_bytes == 1000
    assert both.summary.cycles_by_kind["cycles_off_chip_flash_access"] == 2 * 8864
    assert len(both.ops) == 59 + 3
    assert vela.combined([one], tmp_path) is one
