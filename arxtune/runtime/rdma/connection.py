"""The RDMA transport: one RC queue pair per (peer, device), one registered buffer.

Set-up opens each device, registers the whole buffer (staging + inbox, see
protocol.Layout) once, creates the QPs and swaps QP numbers, PSNs, GIDs, buffer
addresses and rkeys with every rank through `exchange` (the gloo group under
torchrun, so it works wherever torchrun does). The hot path only posts cached
work requests and polls memory: nothing is registered or constructed per call.
"""

from __future__ import annotations

import os
import random
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from arxtune.runtime.rdma.config import RdmaConfig
from arxtune.runtime.rdma.device import Endpoint
from arxtune.runtime.rdma.errors import RdmaError, RdmaTimeout, RdmaUnavailable
from arxtune.runtime.rdma.protocol import Layout, seq_of, stripes

try:
    try:
        import pyverbs.libibverbs_enums as e  # rdma-core 58 and later (the rdma extra's pyverbs)
    except ImportError:
        import pyverbs.enums as e  # before: Debian 12's and Ubuntu 24.04's python3-pyverbs
    from pyverbs.addr import AHAttr, GID, GlobalRoute
    from pyverbs.cq import CQ, cqe_status_to_str
    from pyverbs.device import Context
    from pyverbs.mr import MR
    from pyverbs.pd import PD
    from pyverbs.pyverbs_error import PyverbsError
    from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
    from pyverbs.wr import SGE, SendWR
except ImportError as _exc:  # `arxtune pyverbs install` (PYVERBS_ADVICE) brings it
    PYVERBS_IMPORT_ERROR: ImportError | None = _exc
else:
    PYVERBS_IMPORT_ERROR = None

#: What to run where pyverbs is missing (the runtime cannot import the harness, which builds it).
PYVERBS_ADVICE = "install it with `arxtune pyverbs install` (the rdma extra)"

#: exchange(obj) -> [obj of rank 0, obj of rank 1, ...]; every rank calls it together.
Exchange = Callable[[Any], list]

_POLL_EVERY = 64  # spins between CQ polls / clock reads while waiting for a flag
# After this many spins (~100 us on real hardware, past any decode-sized call) the waiter
# yields the CPU at each poll: with more busy ranks than cores, spinning would starve the
# peers (and a software NIC) it is waiting for.
_YIELD_AFTER = 1024
_QP_STATES = {0: "RESET", 1: "INIT", 2: "RTR", 3: "RTS", 4: "SQD", 5: "SQE", 6: "ERROR"}


def gloo_exchange(group, world: int) -> Exchange:
    """An Exchange over a torch.distributed (gloo) group."""
    import torch.distributed as dist

    def exchange(obj):
        out = [None] * world
        dist.all_gather_object(out, obj, group=group)
        return out

    return exchange


@dataclass
class _Nic:
    """Everything opened on one RDMA device."""

    endpoint: Endpoint
    ctx: Any
    pd: Any
    cq: Any
    mr: Any
    mtu: int
    qps: dict[int, Any] = field(default_factory=dict)  # peer -> QP
    psns: dict[int, int] = field(default_factory=dict)  # peer -> our send PSN
    peer_of_qpn: dict[int, int] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.endpoint.device


class Transport:
    """Put bytes from our staging area into a peer's inbox, flag them, and wait for flags."""

    def __init__(self, cfg: RdmaConfig, endpoints: list[Endpoint], rank: int, world: int,
                 buf: torch.Tensor | None = None):
        """Open devices and register memory: local work only; `connect` does the collective part.

        `buf`: memory to register instead of a buffer of our own (a uint8 CPU tensor of
        at least Layout.total_bytes), e.g. the shared segment the graph engine's proxy serves."""
        if PYVERBS_IMPORT_ERROR is not None:
            raise RdmaUnavailable(f"arx: pyverbs is not importable ({PYVERBS_IMPORT_ERROR}); {PYVERBS_ADVICE}")
        self.cfg, self.rank, self.world = cfg, rank, world
        self.timeout_s = cfg.timeout_s
        self.layout = Layout(world=world, slots=cfg.slots, slot_bytes=cfg.max_bytes, ndev=len(endpoints))
        self.peers = [(rank + i) % world for i in range(1, world)]  # staggered so no rank is everyone's first
        # pinned only where a GPU will copy from it; registration pins the pages either way
        if buf is not None and (buf.dtype != torch.uint8 or buf.numel() < self.layout.total_bytes):
            raise RdmaUnavailable(f"arx: an external buffer must be uint8 of at least {self.layout.total_bytes} bytes")
        self.buf = buf if buf is not None else torch.zeros(
            self.layout.total_bytes, dtype=torch.uint8, pin_memory=torch.cuda.is_available())
        self.base = self.buf.data_ptr()
        L = self.layout
        self.flags = self.buf[L.flags_base : L.total_bytes].view(torch.int64).numpy()
        self._flag_src = self.buf[L.slots * L.slot_bytes : L.slots * L.slot_bytes + L.slots * 8].view(torch.int64).numpy()
        self.nics: list[_Nic] = []
        self._wrs: dict[tuple, tuple] = {}
        self._posted: dict[tuple[int, int], int] = {}  # (nic, peer) -> last step posted
        self._done: dict[tuple[int, int], int] = {}  # (nic, peer) -> last step completed
        try:
            for ep in endpoints:
                self.nics.append(self._open(ep))
        except BaseException:
            self.close()
            raise

    # ---- set-up -------------------------------------------------------------
    def _open(self, ep: Endpoint) -> _Nic:
        try:
            ctx = Context(name=ep.device)
        except PyverbsError as exc:
            raise RdmaUnavailable(f"arx: cannot open RDMA device {ep.device}: {exc}") from exc
        try:
            mtu = ctx.query_port(ep.port).active_mtu
            pd = PD(ctx)
            npeers = self.world - 1
            cq = CQ(ctx, max(64, 4 * (self.cfg.slots + 2) * max(npeers, 1)), None, None, 0)
            access = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE
            mr = MR(pd, self.layout.total_bytes, access, address=self.base)
            nic = _Nic(ep, ctx, pd, cq, mr, mtu)
            for peer in self.peers:
                cap = QPCap(max_send_wr=8 * (self.cfg.slots + 2), max_recv_wr=1, max_send_sge=1, max_recv_sge=1)
                qp = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=cap, sq_sig_all=0))
                nic.qps[peer] = qp
                nic.psns[peer] = random.getrandbits(24)
                nic.peer_of_qpn[qp.qp_num] = peer
            return nic
        except PyverbsError as exc:
            ctx.close()
            raise RdmaUnavailable(f"arx: setting up {ep.device} failed: {exc} (ulimit -l? see `arxtune doctor`)") from exc

    def local_info(self) -> dict:
        """What peers need to reach us: per device GID, MTU, buffer address, rkey, QP numbers, PSNs."""
        L = self.layout
        return {
            "layout": (L.world, L.slots, L.slot_bytes, L.ndev),
            "nics": [
                {"device": n.name, "gid": n.endpoint.gid.gid, "mtu": n.mtu, "addr": self.base, "rkey": n.mr.rkey,
                 "qpn": {p: qp.qp_num for p, qp in n.qps.items()}, "psn": dict(n.psns)}
                for n in self.nics
            ],
        }

    def connect(self, infos: list[dict]) -> None:
        """Bring every QP to RTS against the peers' `local_info()` (infos[r] from rank r)."""
        mine = self.local_info()
        for peer, info in enumerate(infos):
            if info["layout"] != mine["layout"]:
                raise RdmaError(
                    f"arx: rank {peer} has buffer layout (world, slots, max_bytes, devices) = {info['layout']} "
                    f"but this rank has {mine['layout']}; use the same arx settings on every rank", peer=peer, op="connect")
        self.remote = infos
        for i, nic in enumerate(self.nics):
            for peer in self.peers:
                r = infos[peer]["nics"][i]
                attr = QPAttr(port_num=nic.endpoint.port, path_mtu=min(nic.mtu, r["mtu"]))
                attr.qp_access_flags = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE
                attr.dest_qp_num = r["qpn"][self.rank]
                attr.rq_psn = r["psn"][self.rank]
                attr.sq_psn = nic.psns[peer]
                attr.max_dest_rd_atomic = attr.max_rd_atomic = 1
                attr.min_rnr_timer, attr.timeout, attr.retry_cnt, attr.rnr_retry = 12, 14, 7, 7
                gr = GlobalRoute(dgid=GID(r["gid"]), sgid_index=nic.endpoint.gid.index, hop_limit=64)
                attr.ah_attr = AHAttr(gr=gr, is_global=1, port_num=nic.endpoint.port)
                try:
                    nic.qps[peer].to_rts(attr)
                except PyverbsError as exc:
                    raise RdmaError(f"arx: cannot connect QP to {r['device']} GID {r['gid']}: {exc}",
                                    device=nic.name, peer=peer, op="connect") from exc
                self._posted[(i, peer)] = self._done[(i, peer)] = -1

    # ---- hot path -----------------------------------------------------------
    def begin(self, step: int, op: str) -> None:
        """Make staging slot and flag source of `step` writable, then stamp its sequence number."""
        self.wait_sends(step - self.layout.slots, op)
        self._flag_src[self.layout.slot(step)] = seq_of(step)

    def put(self, step: int, peer: int, src_off: int, dst_off: int, nbytes: int, op: str) -> None:
        """RDMA-write buf[src_off:+nbytes] to the peer's buf[dst_off:], then our flag for `step`."""
        slot = self.layout.slot(step)
        for dev, off, length in stripes(nbytes, len(self.nics), self.cfg.stripe_min_bytes):
            key = (peer, dev, slot, src_off + off, dst_off + off, length)
            wrs = self._wrs.get(key)
            if wrs is None:
                wrs = self._wrs[key] = self._make_wrs(*key)
            wrs[-1].wr_id = step
            try:
                self.nics[dev].qps[peer].post_send(wrs[0])
            except PyverbsError as exc:
                raise RdmaError(f"arx: posting a write failed: {exc}; QP state {self._qp_state(dev, peer)}",
                                device=self.nics[dev].name, peer=peer, op=op) from exc
            self._posted[(dev, peer)] = step

    def _make_wrs(self, peer: int, dev: int, slot: int, src_off: int, dst_off: int, length: int) -> tuple:
        """payload WR -> flag WR, chained so one post_send sends both in order on one QP.
        A SendWR copies its SGE at construction, hence one cached pair per key."""
        nic, remote = self.nics[dev], self.remote[peer]["nics"][dev]
        L, lkey = self.layout, nic.mr.lkey
        flag = SendWR(opcode=e.IBV_WR_RDMA_WRITE, num_sge=1, send_flags=e.IBV_SEND_SIGNALED,
                      sg=[SGE(self.base + L.flag_source(slot), 8, lkey)])
        flag.set_wr_rdma(remote["rkey"], remote["addr"] + L.flag(slot, self.rank, dev))
        if length == 0:
            return (flag,)
        payload = SendWR(opcode=e.IBV_WR_RDMA_WRITE, num_sge=1, send_flags=0, sg=[SGE(self.base + src_off, length, lkey)])
        payload.set_wr_rdma(remote["rkey"], remote["addr"] + dst_off)
        payload.next_wr = flag
        return (payload, flag)

    def wait(self, step: int, src: int, nbytes: int, op: str) -> None:
        """Block until `src`'s payload and flag for `step` have landed here, or raise."""
        seq, flags, L = seq_of(step), self.flags, self.layout
        for dev, _, _ in stripes(nbytes, len(self.nics), self.cfg.stripe_min_bytes):
            idx = L.flag_index(step, src, dev)
            if flags[idx] == seq:
                continue
            deadline = time.monotonic() + self.timeout_s
            spins = 0
            while flags[idx] != seq:
                spins += 1
                if spins % _POLL_EVERY == 0:
                    self.poll(op)
                    if spins >= _YIELD_AFTER:
                        os.sched_yield()
                    if time.monotonic() > deadline:
                        raise RdmaTimeout(
                            f"arx: rank {src} sent nothing for step {step} within {self.timeout_s:g} s "
                            f"(flag {int(flags[idx])}, want {seq}; QP state {self._qp_state(dev, src)}): "
                            f"the peer stopped, crashed or runs a different sequence of collectives",
                            device=self.nics[dev].name, peer=src, op=op)

    def poll(self, op: str) -> None:
        """Reap send completions; a bad one becomes an RdmaError naming device and peer."""
        for i, nic in enumerate(self.nics):
            while True:
                n, wcs = nic.cq.poll(16)
                for wc in wcs:
                    peer = nic.peer_of_qpn.get(wc.qp_num)
                    if wc.status != e.IBV_WC_SUCCESS:
                        raise RdmaError(
                            f"arx: RDMA write failed: {cqe_status_to_str(wc.status)} (status {wc.status}, "
                            f"vendor error {wc.vendor_err}); QP state {self._qp_state(i, peer)}",
                            device=nic.name, peer=peer, op=op)
                    self._done[(i, peer)] = wc.wr_id
                if n < 16:
                    break

    def wait_sends(self, step: int, op: str) -> None:
        """Block until every write of steps <= `step` has completed (its source may be reused)."""
        if step < 0:
            return
        deadline = None
        while any(self._done[k] < min(step, posted) for k, posted in self._posted.items()):
            self.poll(op)
            os.sched_yield()
            if deadline is None:
                deadline = time.monotonic() + self.timeout_s
            elif time.monotonic() > deadline:
                (dev, peer), _ = next((k, p) for k, p in self._posted.items() if self._done[k] < min(step, p))
                raise RdmaTimeout(
                    f"arx: writes of step {step} not acknowledged within {self.timeout_s:g} s; "
                    f"QP state {self._qp_state(dev, peer)}", device=self.nics[dev].name, peer=peer, op=op)

    # ---- diagnostics and teardown ------------------------------------------
    def _qp_state(self, dev: int, peer: int | None) -> str:
        try:
            attr, _ = self.nics[dev].qps[peer].query(e.IBV_QP_STATE)
            return _QP_STATES.get(attr.qp_state, str(attr.qp_state))
        except Exception as exc:  # diagnostics only: never mask the real error
            return f"unknown ({exc})"

    def close(self) -> None:
        """Finish outstanding writes (best effort), then release QPs, MRs, CQs, PDs, contexts."""
        try:
            if self.nics and self._posted:
                self.wait_sends(max(self._posted.values()), "close")
        except RdmaError:
            pass
        finally:
            self._wrs.clear()
            for nic in reversed(self.nics):
                for qp in nic.qps.values():
                    qp.close()
                for obj in (nic.mr, nic.cq, nic.pd, nic.ctx):
                    obj.close()
            self.nics = []


def open_transport(cfg: RdmaConfig, rank: int, world: int, exchange: Exchange, devices=None,
                   buf: torch.Tensor | None = None) -> Transport:
    """Discover, open, exchange and connect, agreeing with every rank at each collective step.

    A rank that cannot run still joins both exchanges (carrying its reason), so the
    others raise the same RdmaUnavailable instead of waiting for it forever.
    `devices` is the sysfs discovery result (read_devices()) when the caller already has it;
    `buf` is memory to register instead of the transport's own buffer.
    """
    from arxtune.runtime.rdma.device import check_memlock, read_devices, select_endpoints

    transport, error = None, None
    try:
        endpoints = select_endpoints(cfg, read_devices() if devices is None else devices)
        check_memlock(Layout(world, cfg.slots, cfg.max_bytes, len(endpoints)).total_bytes)
        transport = Transport(cfg, endpoints, rank, world, buf)
    except RdmaUnavailable as exc:
        error = str(exc)
    except Exception as exc:  # carried to every rank and raised there: a lone failure must not hang the rest
        error = f"arx: set-up failed: {type(exc).__name__}: {exc}"
    for stage in ("set-up", "connect"):
        infos = exchange({"error": error} if error else (transport.local_info() if stage == "set-up" else {}))
        bad = [f"rank {r}: {i['error']}" for r, i in enumerate(infos) if i.get("error")]
        if bad:
            if transport is not None:
                transport.close()
            raise RdmaUnavailable(bad[0] if len(bad) == 1 else "; ".join(bad))
        if stage == "set-up":
            try:
                transport.connect(infos)
            except RdmaError as exc:
                error = str(exc)
    return transport
