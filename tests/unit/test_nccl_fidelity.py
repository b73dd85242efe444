"""benchmarks/nccl_fidelity.py reads nccl-tests' output: its table and the NCCL it ran."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "nccl_fidelity.py"
_spec = importlib.util.spec_from_file_location("nccl_fidelity", _PATH)
fidelity = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = fidelity  # its dataclass looks its module up there
_spec.loader.exec_module(fidelity)

OUTPUT = """# nccl-tests version 2.19.6 nccl-headers=22809 nccl-library=22107
# Collective test starting: all_reduce_perf
#
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)  (GB/s)  (GB/s)
        8192          4096  bfloat16     sum      -1     6.85    1.20    0.00       0     0.21   39.01    0.00       0
     1048576        524288  bfloat16     sum      -1     6.98  150.22    0.00       0     0.20  5242.88   0.00       0
# Out of bounds values : 0 OK
"""


def test_the_out_of_place_column_and_the_library_version_are_read():
    assert fidelity.parse_out_of_place_us(OUTPUT) == {8192: 6.85, 1048576: 6.98}
    assert fidelity.library_version(OUTPUT) == 22107
    assert fidelity.library_version("# nccl-tests version 2.10.0") is None


def test_output_without_a_table_is_an_error_that_shows_it():
    with pytest.raises(SystemExit, match="no nccl-tests results"):
        fidelity.parse_out_of_place_us("# nccl-tests version 2.19.6\nsomething went wrong\n")


def test_a_size_printed_in_several_cycles_counts_at_its_median():
    rows = "\n".join(
        f"        8192          4096  bfloat16     sum      -1     {t}    1.20    0.00       0     0.21   39.01    0.00       0"
        for t in ("6.0", "9.0", "7.0")
    )
    header = OUTPUT.split("        8192")[0]
    assert fidelity.parse_out_of_place_us(header + rows + "\n") == {8192: 7.0}


def test_rounds_are_compared_side_by_side_and_nccl_tests_against_itself_is_reported():
    rounds = [
        {"arxtune": {("eager", 8): 10.0}, "eager": {8: 9.0}, "eager_after": {8: 11.0}},  # a fast process on both sides
        {"arxtune": {("eager", 8): 14.0}, "eager": {8: 12.0}, "eager_after": {8: 12.0}},
        {"arxtune": {("eager", 8): 13.0}, "eager": {8: 14.0}, "eager_after": {8: 12.0}},
    ]
    p = fidelity.paired(rounds, "eager", 8)
    assert p.ratio == 1.0  # the median of 1.0, 1.167, 1.0: not 13 / 12
    assert (p.ours, p.theirs) == (13.0, 12.0)
    assert p.spread_ours == 1.4 and p.spread_theirs == 13 / 10
    assert p.control == 1.0  # the median of 11/9, 1, 12/14
    assert all(x != x for x in vars(fidelity.paired(rounds, "graph", 8)).values())  # nothing measured: nan
