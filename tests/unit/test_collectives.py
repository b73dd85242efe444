import pytest
import torch

from arxtune.runtime.ops import DTYPES, OP_SPECS, elements_per_rank, expected_output, make_input, mismatch, size_grid


@pytest.mark.parametrize("dtype", list(DTYPES.values()))
@pytest.mark.parametrize("world", [2, 3, 8])
@pytest.mark.parametrize("op", list(OP_SPECS))
def test_reference_matches_a_naive_collective_exactly(op, dtype, world):
    n = 1000
    inputs = [make_input(op, n, r, world, dtype, torch.device("cpu")) for r in range(world)]
    for rank in range(world):
        if op == "all_reduce":
            got = inputs[0].clone()
            for x in inputs[1:]:
                got += x  # summed in the input dtype: exact only because the data is built to be
        elif op == "all_gather":
            got = torch.cat(inputs)
        else:
            got = inputs[0][rank * n : (rank + 1) * n].clone()
            for x in inputs[1:]:
                got += x[rank * n : (rank + 1) * n]
        assert mismatch(got, expected_output(op, n, rank, world, dtype)) is None


def test_inputs_differ_between_ranks_and_positions():
    a = make_input("all_reduce", 64, 0, 2, torch.bfloat16, torch.device("cpu"))
    b = make_input("all_reduce", 64, 1, 2, torch.bfloat16, torch.device("cpu"))
    assert not torch.equal(a, b)
    assert len(set(a.tolist())) > 8


def test_mismatch_reports_the_first_wrong_element():
    expected = expected_output("all_reduce", 16, 0, 2, torch.float32)
    wrong = expected.clone()
    wrong[5] += 1
    message = mismatch(wrong, expected)
    assert message is not None and "1 of 16" in message and "first at 5" in message
    assert mismatch(expected[:8], expected) is not None


def test_size_grid_is_geometric_and_inclusive():
    assert size_grid(1024, 16 << 20, 2) == [1024 << k for k in range(15)]
    assert size_grid(1000, 1000, 2) == [1000]
    with pytest.raises(ValueError):
        size_grid(0, 10, 2)


def test_elements_round_down_to_whole_ranks():
    assert elements_per_rank("all_reduce", 1024, 3, 4) == 256
    n = elements_per_rank("all_gather", 1024, 3, 4)
    assert n == 85 and OP_SPECS["all_gather"].nbytes(n, 3, 4) == 1020
    assert elements_per_rank("reduce_scatter", 4, 8, 4) == 1


def test_bus_factors_follow_nccl_tests():
    assert OP_SPECS["all_reduce"].bus_factor(4) == pytest.approx(1.5)
    assert OP_SPECS["all_gather"].bus_factor(4) == pytest.approx(0.75)
    assert OP_SPECS["reduce_scatter"].bus_factor(2) == pytest.approx(0.5)
