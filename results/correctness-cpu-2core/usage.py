import sys, torch, torch.distributed as dist
from arxtune.runtime.communicator import Communicator
dist.init_process_group("gloo")
comm = Communicator.from_env(sys.argv[1] if len(sys.argv) > 1 else None)
y = comm.all_reduce(torch.ones(1024))
assert torch.equal(y, torch.full((1024,), 2.0))
if "close" in sys.argv[2:]:
    comm.close()
if "destroy" in sys.argv[2:]:
    dist.destroy_process_group()
