"""How collective calls are timed: the timers live in arxtune.runtime.timing (torch only), so the
start-up ladder of a serving process times exactly as a sweep does; re-exported here for the harness."""

from arxtune.runtime.timing import (  # noqa: F401
    CPU_EAGER_SAMPLE_BYTES,
    EAGER_OPS_PER_SAMPLE,
    GRAPH_OPS_PER_SAMPLE,
    SETTLE_GRAPHS,
    TIMERS,
    CudaBackToBackTimer,
    CudaGraphTimer,
    CudaIsolatedTimer,
    Op,
    Timer,
    WallTimer,
    has_timer,
    make_timer,
)
