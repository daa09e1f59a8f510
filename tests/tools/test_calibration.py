"""--calibration arrays reach the model inputs they name: by input name when the .npz names
every input (in any order), in the file's order when it names none (a typo is refused);
and they must fit the inputs. Several samples come from a leading sample axis or several
files; some are held out to measure on; a stream's states are paired with its outputs."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest
import torch

from recurrent_lowering.tools.lowering import calibration, model_source, npu, report, targets
from recurrent_lowering.tools.lowering.errors import LoweringError


class _StreamLstm(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = torch.nn.LSTM(5, 8, batch_first=True)

    def forward(self, x, h0, c0):
        return self.rnn(x, (h0, c0))


@pytest.fixture
def stream_pt2(tmp_path):
    inputs = (torch.zeros(1, 1, 5), torch.zeros(1, 1, 8), torch.zeros(1, 1, 8))
    program = torch.export.export(_StreamLstm().eval(), inputs)
    torch.export.save(program, str(tmp_path / "m.pt2"))
    return model_source.load(str(tmp_path / "m.pt2"))


def _first_values(source, npz):
    options = targets.Options(calibration=[npz])
    samples, _ = npu._inputs(source, options, report.empty("TOSA-1.0+INT", "m"))
    return [float(t.flatten()[0]) for t in samples[0]]


def test_arrays_are_matched_by_input_name(stream_pt2, tmp_path):
    npz = tmp_path / "c.npz"  # h0 and c0 have one shape: only the names tell them apart
    np.savez(npz, x=np.zeros((1, 1, 5)), c0=np.full((1, 1, 8), 7.0), h0=np.full((1, 1, 8), -1.0))
    assert _first_values(stream_pt2, npz) == [0.0, -1.0, 7.0]


def test_unnamed_arrays_are_taken_in_file_order(stream_pt2, tmp_path):
    npz = tmp_path / "c.npz"
    np.savez(npz, np.zeros((1, 1, 5)), np.full((1, 1, 8), 2.0), np.full((1, 1, 8), 3.0))
    assert _first_values(stream_pt2, npz) == [0.0, 2.0, 3.0]


def test_a_misnamed_array_is_refused_not_taken_in_file_order(stream_pt2, tmp_path):
    """With one name a typo, file order fed c0's array to h0 and h0's to c0, silently."""
    npz = tmp_path / "c.npz"
    np.savez(npz, x=np.zeros((1, 1, 5)), c_0=np.full((1, 1, 8), 7.0), h0=np.full((1, 1, 8), -1.0))
    with pytest.raises(LoweringError, match=r"no array for model input\(s\) c0; array\(s\) c_0"):
        _first_values(stream_pt2, npz)


def test_an_array_naming_no_input_is_refused(stream_pt2, tmp_path):
    npz = tmp_path / "c.npz"
    arrays = dict(x=np.zeros((1, 1, 5)), h0=np.zeros((1, 1, 8)), c0=np.zeros((1, 1, 8)))
    np.savez(npz, **arrays, lengths=np.ones(1))
    with pytest.raises(LoweringError, match=r"array\(s\) lengths name no model input"):
        _first_values(stream_pt2, npz)


def test_dynamic_dimensions_take_any_size():
    calibration.check("c.npz", [np.zeros((1, 9, 4))], [("x", (1, None, 4))])
    with pytest.raises(LoweringError, match=r"array 0 has shape \[9, 4\]; .* takes \[1, \?, 4\]"):
        calibration.check("c.npz", [np.zeros((9, 4))], [("x", (1, None, 4))])


def test_non_finite_samples_refused():
    """A NaN reached torch.histc in the observer: an internal error, not the file's name."""
    calibration.check(
        "c.npz", [np.zeros((1, 4)), np.ones(2, np.int64)], [("x", (1, 4)), ("n", (2,))]
    )
    for bad in (np.nan, np.inf):
        array = np.zeros((1, 4), np.float32)
        array[0, 2] = bad
        with pytest.raises(
            LoweringError, match=r"c.npz: array 0 \(model input 'x'\) holds NaN or inf"
        ):
            calibration.check("c.npz", [array], [("x", (1, 4))])


def test_dynamic_dimension_ranges_are_checked():
    """A .pt2's Dim(min, max): a calibration outside it lowered the model for a size the
    program does not take (or failed on a guard with a traceback)."""
    specs = [("x", (1, (2, 8), 4))]
    calibration.check("c.npz", [np.zeros((1, 5, 4))], specs)
    with pytest.raises(
        LoweringError, match=r"has shape \[1, 9, 4\]; model input 'x' takes \[1, 2..8, 4\]"
    ):
        calibration.check("c.npz", [np.zeros((1, 9, 4))], specs)
    calibration.check("c.npz", [np.zeros((1, 500, 4))], [("x", (1, (2, None), 4))])


def test_torch_input_specs_read_the_programs_ranges():
    batch = torch.export.Dim("batch", min=2, max=8)
    program = torch.export.export(
        torch.nn.Linear(4, 2), (torch.zeros(3, 4),), dynamic_shapes={"input": {0: batch}}
    )
    source = model_source.ModelSource(
        "m", "torch", pathlib.Path("m.pt2"), program, (torch.zeros(3, 4),)
    )
    ((name, shape, dtype),) = calibration.torch_input_specs(source)
    assert shape == ((2, 8), 4) and dtype == torch.float32


SPECS = [("x", (1, 4)), ("h", (1, 2))]


def test_a_leading_axis_holds_samples_and_files_add_up(tmp_path):
    np.savez(tmp_path / "a.npz", x=np.arange(12.0).reshape(3, 1, 4), h=np.zeros((1, 2)))
    np.savez(tmp_path / "b.npz", x=np.ones((1, 4)), h=np.ones((1, 2)))
    samples = calibration.load_samples(f"{tmp_path / 'a.npz'},{tmp_path / 'b.npz'}", SPECS)
    assert len(samples) == 4
    assert [float(s[0][0, 0]) for s in samples] == [0.0, 4.0, 8.0, 1.0]
    assert all(s[1].shape == (1, 2) for s in samples)  # h given once: the same in a file


def test_samples_must_agree(tmp_path):
    np.savez(tmp_path / "a.npz", x=np.zeros((3, 1, 4)), h=np.zeros((2, 1, 2)))
    with pytest.raises(LoweringError, match="different numbers of samples"):
        calibration.load_samples([tmp_path / "a.npz"], SPECS)
    specs = [("x", (1, None))]
    np.savez(tmp_path / "b.npz", x=np.zeros((1, 4)))
    np.savez(tmp_path / "c.npz", x=np.zeros((1, 5)))
    with pytest.raises(LoweringError, match="every sample takes the same shapes") as refused:
        calibration.load_samples([tmp_path / "b.npz", tmp_path / "c.npz"], specs)
    # the file and sample that differ (it named b.npz and the sample's index over both files)
    assert str(refused.value).startswith(f"{tmp_path / 'c.npz'}: sample 0 has shapes [[1, 5]]")


def test_held_out_samples():
    eight = list(range(8))
    assert calibration.held_out(eight, None) == (eight[:6], eight[6:], None)
    assert calibration.held_out(eight, [9]) == (eight, [9], None)
    calibrate, measure, warning = calibration.held_out([0], None)
    assert calibrate == measure == [0] and "flatters" in warning


def test_a_streams_states_pair_with_its_outputs():
    from recurrent_lowering.runtime import streams

    x, h, c = np.zeros((1, 1, 5)), np.zeros((1, 1, 8)), np.zeros((1, 1, 8))
    assert streams.pairs([x, h, c], [np.zeros((1, 1, 8))] * 3) == [(1, 1), (2, 2)]
    assert streams.pairs([x, h], [np.zeros((1, 1, 8))]) == []  # no state output
    assert streams.pairs([x, np.array(16000)], [x, x]) == []  # an integer input: no state
    assert streams.pairs([x, h], [x, np.zeros((1, 2, 8))]) == []  # shapes differ

    def step(inputs):  # a state that counts
        return [inputs[0], inputs[1] + 1]

    taken, produced = streams.fed_back(step, [[x, h]] * 3, [(1, 1)])
    assert [float(t[1].max()) for t in taken] == [0.0, 1.0, 2.0]
    assert float(produced[-1][1].max()) == 3.0
