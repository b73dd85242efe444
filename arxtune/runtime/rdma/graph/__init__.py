"""arx inside CUDA graphs: GPU kernels talk to a proxy process through shared memory.

Per rank, one file in /dev/shm (segment.py) holds a control block and the
protocol buffer (protocol.Layout). The GPU side (gpu.py, Triton kernels in
kernels.py) stages its input there and rings a doorbell; the rank's proxy
process (proxy.py) reads the step's plan (plan.py) and writes payload + flag
into every peer's segment through a transport: shared memory on one host
(fabric.py) or RDMA queue pairs (rdma.connection). The GPU polls the flags with
bounded waits and finishes the step in the same kernel. Nothing on the path
needs the host, so the whole collective records into a CUDA graph.
tests/helpers/arxg_cpu_rank.py runs the same protocol on the CPU, for tests without a GPU.
"""
