"""ib_write_lat as the fabric floor: the parser (the device run is tests/rdma/device/test_floor_device.py)."""

from __future__ import annotations

import pytest

from arxtune.runtime.rdma.errors import RdmaError
from arxtune.runtime.rdma.floor import parse_write_lat

SAMPLE = """
                    RDMA_Write Latency Test
 Dual-port       : OFF          Device         : rxe0
---------------------------------------------------------------------------------------
 #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] 
 2       1000          17.03          210.35       24.61               27.33          9.21            70.12                  210.35  
---------------------------------------------------------------------------------------
"""


def test_parse_write_lat_takes_t_typical():
    assert parse_write_lat(SAMPLE) == 24.61


def test_a_figure_that_is_not_a_latency_is_refused_not_recorded():
    """Under a VM perftest's clock conversion can fail and print inf: that must not reach a run's meta.json."""
    for bad in ("inf", "0.00", "nan"):
        with pytest.raises(RdmaError, match=f"t_typical of {bad} us, not a latency"):
            parse_write_lat(SAMPLE.replace("24.61", bad))


def test_parse_write_lat_without_a_row_is_a_clear_error():
    with pytest.raises(RdmaError, match="t_typical row"):
        parse_write_lat("Couldn't connect to 127.0.0.1:18515")
