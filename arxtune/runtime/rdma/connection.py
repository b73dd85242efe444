"""The RDMA transport: one RC queue pair per link to a peer, one registered buffer.

Set-up first swaps every rank's devices, their IPv4 subnets and port states
(reach.RankFacts) and derives the links to each peer (reach.routes: a device
serves a peer it shares a subnet with; no link to some peer is one error on
every rank). It then opens the devices that serve a peer, registers the whole
buffer (staging + inbox, see protocol.Layout) once on each, creates a QP per
link and swaps QP numbers, PSNs, buffer addresses and rkeys with every rank
through `exchange` (the gloo group under torchrun, so it works wherever
torchrun does). A write to a peer stripes over that peer's links; stripe k
raises flag word k. The hot path only posts cached work requests and polls
memory: nothing is registered or constructed per call.
"""

from __future__ import annotations

import os
import random
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from arxtune.runtime.rdma import reach
from arxtune.runtime.rdma.config import RdmaConfig
from arxtune.runtime.rdma.errors import RdmaError, RdmaTimeout, RdmaUnavailable
from arxtune.runtime.rdma.protocol import Layout, seq_of, stripes
from arxtune.runtime.rdma.reach import Link, RankFacts

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
    """Everything opened on one RDMA device; QPs only to the peers it has a link to."""

    name: str
    port: int
    ctx: Any
    pd: Any
    cq: Any
    mr: Any
    mtu: int
    qps: dict[int, Any] = field(default_factory=dict)  # peer -> QP
    psns: dict[int, int] = field(default_factory=dict)  # peer -> our send PSN
    peer_of_qpn: dict[int, int] = field(default_factory=dict)


class Transport:
    """Put bytes from our staging area into a peer's inbox, flag them, and wait for flags."""

    def __init__(
        self,
        cfg: RdmaConfig,
        links: dict[int, tuple[Link, ...]],
        rank: int,
        world: int,
        buf: torch.Tensor | None = None,
        ndev: int | None = None,
    ):
        """Open the devices that serve a peer and register memory: local work only; `connect` does the collective part.

        `links`: peer -> its links in stripe order (reach.routes). `ndev`: flag words per peer in the
        layout, the same on every rank (default: the most links of any peer here). `buf`: memory to
        register instead of a buffer of our own (a uint8 CPU tensor of at least Layout.total_bytes),
        e.g. the shared segment the graph engine's proxy serves."""
        if PYVERBS_IMPORT_ERROR is not None:
            raise RdmaUnavailable(f"arx: pyverbs is not importable ({PYVERBS_IMPORT_ERROR}); {PYVERBS_ADVICE}")
        self.cfg, self.rank, self.world = cfg, rank, world
        self.timeout_s = cfg.timeout_s
        self.peers = [(rank + i) % world for i in range(1, world)]  # staggered so no rank is everyone's first
        missing = [p for p in self.peers if not links.get(p)]
        if missing:
            raise RdmaUnavailable(f"arx: rank {rank} has no link to rank(s) {', '.join(map(str, missing))}")
        self.links = {p: tuple(links[p]) for p in self.peers}
        ndev = ndev or max((len(v) for v in self.links.values()), default=1)
        if any(len(v) > ndev for v in self.links.values()):
            raise RdmaUnavailable(f"arx: a peer has more links than the layout's {ndev} flag words")
        self.layout = Layout(world=world, slots=cfg.slots, slot_bytes=cfg.max_bytes, ndev=ndev)
        # pinned only where a GPU will copy from it; registration pins the pages either way
        if buf is not None and (buf.dtype != torch.uint8 or buf.numel() < self.layout.total_bytes):
            raise RdmaUnavailable(f"arx: an external buffer must be uint8 of at least {self.layout.total_bytes} bytes")
        self.buf = buf if buf is not None else torch.zeros(self.layout.total_bytes, dtype=torch.uint8, pin_memory=torch.cuda.is_available())
        self.base = self.buf.data_ptr()
        L = self.layout
        self.flags = self.buf[L.flags_base : L.total_bytes].view(torch.int64).numpy()
        self._flag_src = self.buf[L.slots * L.slot_bytes : L.slots * L.slot_bytes + L.slots * 8].view(torch.int64).numpy()
        self.nics: list[_Nic] = []
        names = list(dict.fromkeys(link.local for p in self.peers for link in self.links[p]))
        #: peer -> the nic (index into self.nics) of each stripe
        self.lanes = {p: [names.index(link.local) for link in self.links[p]] for p in self.peers}
        self._wrs: dict[tuple, tuple] = {}
        self._posted: dict[tuple[int, int], int] = {}  # (nic, peer) -> last step posted
        self._done: dict[tuple[int, int], int] = {}  # (nic, peer) -> last step completed
        try:
            for i, name in enumerate(names):
                self.nics.append(self._open(name, [p for p in self.peers if i in self.lanes[p]]))
        except BaseException:
            self.close()
            raise

    # ---- set-up -------------------------------------------------------------
    def _open(self, name: str, peers: list[int]) -> _Nic:
        port = self.cfg.port
        try:
            ctx = Context(name=name)
        except PyverbsError as exc:
            raise RdmaUnavailable(f"arx: cannot open RDMA device {name}: {exc}") from exc
        try:
            mtu = ctx.query_port(port).active_mtu
            pd = PD(ctx)
            cq = CQ(ctx, max(64, 4 * (self.cfg.slots + 2) * max(len(peers), 1)), None, None, 0)
            access = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE
            mr = MR(pd, self.layout.total_bytes, access, address=self.base)
            nic = _Nic(name, port, ctx, pd, cq, mr, mtu)
            for peer in peers:
                cap = QPCap(max_send_wr=8 * (self.cfg.slots + 2), max_recv_wr=1, max_send_sge=1, max_recv_sge=1)
                qp = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=cap, sq_sig_all=0))
                nic.qps[peer] = qp
                nic.psns[peer] = random.getrandbits(24)
                nic.peer_of_qpn[qp.qp_num] = peer
            return nic
        except PyverbsError as exc:
            ctx.close()
            raise RdmaUnavailable(f"arx: setting up {name} failed: {exc} (ulimit -l? see `arxtune doctor`)") from exc

    def local_info(self) -> dict:
        """What peers need to reach us: per device MTU, buffer address, rkey, QP numbers, PSNs (GIDs came with the facts)."""
        L = self.layout
        return {
            "layout": (L.world, L.slots, L.slot_bytes, L.ndev),
            "nics": {
                n.name: {
                    "mtu": n.mtu,
                    "addr": self.base,
                    "rkey": n.mr.rkey,
                    "qpn": {p: qp.qp_num for p, qp in n.qps.items()},
                    "psn": dict(n.psns),
                }
                for n in self.nics
            },
        }

    def connect(self, infos: list[dict]) -> None:
        """Bring every QP to RTS against the peers' `local_info()` (infos[r] from rank r)."""
        mine = self.local_info()
        for peer, info in enumerate(infos):
            if info["layout"] != mine["layout"]:
                raise RdmaError(
                    f"arx: rank {peer} has buffer layout (world, slots, max_bytes, devices) = {info['layout']} "
                    f"but this rank has {mine['layout']}; use the same arx settings on every rank",
                    peer=peer,
                    op="connect",
                )
        self.remote = infos
        for peer in self.peers:
            for nic_index, link in zip(self.lanes[peer], self.links[peer]):
                nic = self.nics[nic_index]
                r = infos[peer]["nics"].get(link.remote, {})
                if self.rank not in r.get("qpn", {}):
                    raise RdmaError(
                        f"arx: rank {peer} opened no queue pair on {link.remote} for this rank's {link.local} "
                        f"({link.subnet}); every rank must derive the same links",
                        device=nic.name,
                        peer=peer,
                        op="connect",
                    )
                attr = QPAttr(port_num=nic.port, path_mtu=min(nic.mtu, r["mtu"]))
                attr.qp_access_flags = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE
                attr.dest_qp_num = r["qpn"][self.rank]
                attr.rq_psn = r["psn"][self.rank]
                attr.sq_psn = nic.psns[peer]
                attr.max_dest_rd_atomic = attr.max_rd_atomic = 1
                attr.min_rnr_timer, attr.timeout, attr.retry_cnt, attr.rnr_retry = 12, 14, 7, 7
                gr = GlobalRoute(dgid=GID(link.dgid), sgid_index=link.sgid_index, hop_limit=64)
                attr.ah_attr = AHAttr(gr=gr, is_global=1, port_num=nic.port)
                try:
                    nic.qps[peer].to_rts(attr)
                except PyverbsError as exc:
                    raise RdmaError(
                        f"arx: cannot connect QP to {link.remote} GID {link.dgid} ({link.subnet}): {exc}",
                        device=nic.name,
                        peer=peer,
                        op="connect",
                    ) from exc
                self._posted[(nic_index, peer)] = self._done[(nic_index, peer)] = -1

    # ---- hot path -----------------------------------------------------------
    def begin(self, step: int, op: str) -> None:
        """Make staging slot and flag source of `step` writable, then stamp its sequence number."""
        self.wait_sends(step - self.layout.slots, op)
        self._flag_src[self.layout.slot(step)] = seq_of(step)

    def put(self, step: int, peer: int, src_off: int, dst_off: int, nbytes: int, op: str) -> None:
        """RDMA-write buf[src_off:+nbytes] to the peer's buf[dst_off:], then our flag for `step`."""
        slot = self.layout.slot(step)
        lanes = self.lanes[peer]
        for k, off, length in stripes(nbytes, len(lanes), self.cfg.stripe_min_bytes):
            key = (peer, k, slot, src_off + off, dst_off + off, length)
            wrs = self._wrs.get(key)
            if wrs is None:
                wrs = self._wrs[key] = self._make_wrs(*key)
            wrs[-1].wr_id = step
            dev = lanes[k]
            try:
                self.nics[dev].qps[peer].post_send(wrs[0])
            except PyverbsError as exc:
                raise RdmaError(
                    f"arx: posting a write failed: {exc}; QP state {self._qp_state(dev, peer)}",
                    device=self.nics[dev].name,
                    peer=peer,
                    op=op,
                ) from exc
            self._posted[(dev, peer)] = step

    def _make_wrs(self, peer: int, k: int, slot: int, src_off: int, dst_off: int, length: int) -> tuple:
        """payload WR -> flag WR of stripe k, chained so one post_send sends both in order on one QP.
        A SendWR copies its SGE at construction, hence one cached pair per key."""
        nic, remote = self.nics[self.lanes[peer][k]], self.remote[peer]["nics"][self.links[peer][k].remote]
        L, lkey = self.layout, nic.mr.lkey
        flag = SendWR(
            opcode=e.IBV_WR_RDMA_WRITE, num_sge=1, send_flags=e.IBV_SEND_SIGNALED, sg=[SGE(self.base + L.flag_source(slot), 8, lkey)]
        )
        flag.set_wr_rdma(remote["rkey"], remote["addr"] + L.flag(slot, self.rank, k))
        if length == 0:
            return (flag,)
        payload = SendWR(opcode=e.IBV_WR_RDMA_WRITE, num_sge=1, send_flags=0, sg=[SGE(self.base + src_off, length, lkey)])
        payload.set_wr_rdma(remote["rkey"], remote["addr"] + dst_off)
        payload.next_wr = flag
        return (payload, flag)

    def wait(self, step: int, src: int, nbytes: int, op: str) -> None:
        """Block until `src`'s payload and flag for `step` have landed here, or raise."""
        seq, flags, L = seq_of(step), self.flags, self.layout
        lanes = self.lanes[src]
        for k, _, _ in stripes(nbytes, len(lanes), self.cfg.stripe_min_bytes):
            idx = L.flag_index(step, src, k)
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
                            f"(flag {int(flags[idx])}, want {seq}; QP state {self._qp_state(lanes[k], src)}): "
                            f"the peer stopped, crashed or runs a different sequence of collectives",
                            device=self.nics[lanes[k]].name,
                            peer=src,
                            op=op,
                        )

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
                            device=nic.name,
                            peer=peer,
                            op=op,
                        )
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
                    f"arx: writes of step {step} not acknowledged within {self.timeout_s:g} s; QP state {self._qp_state(dev, peer)}",
                    device=self.nics[dev].name,
                    peer=peer,
                    op=op,
                )

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


def share_facts(cfg: RdmaConfig, rank: int, exchange: Exchange, facts: RankFacts | None = None) -> list[RankFacts]:
    """Every rank's devices, subnets and port states (reach.RankFacts), in rank order: one exchange.

    A rank that cannot read its own still joins the exchange with its reason, so every rank raises it."""
    error = None
    try:
        facts = facts or reach.local_facts(cfg, rank)
    except RdmaUnavailable as exc:
        error = str(exc)
    except Exception as exc:  # carried to every rank and raised there: a lone failure must not hang the rest
        error = f"arx: reading the RDMA devices failed: {type(exc).__name__}: {exc}"
    infos = exchange({"error": error} if error else {"facts": facts})
    bad = [f"rank {r}: {i['error']}" for r, i in enumerate(infos) if i.get("error")]
    if bad:
        raise RdmaUnavailable(bad[0] if len(bad) == 1 else "; ".join(bad))
    return [i["facts"] for i in infos]


def open_transport(
    cfg: RdmaConfig,
    rank: int,
    world: int,
    exchange: Exchange,
    facts: RankFacts | None = None,
    buf: torch.Tensor | None = None,
    width: int | None = None,
) -> Transport:
    """Share facts, derive links, open, exchange and connect, agreeing with every rank at each collective step.

    A rank that cannot run still joins every exchange (carrying its reason), so the
    others raise the same RdmaUnavailable instead of waiting for it forever; a pair of
    ranks without a link is reach.Unreachable on every rank, before any queue pair exists.
    `facts` is this rank's reach.local_facts() when the caller already has it; `buf` is
    memory to register instead of the transport's own buffer; `width` stripes every peer
    over exactly that many links (the graph engine's kernels wait for one count of flags).
    """
    from arxtune.runtime.rdma.device import check_memlock

    group = share_facts(cfg, rank, exchange, facts)
    links = reach.routes(group, rank, width)
    ndev = width or reach.widest(group)
    transport, error = None, None
    try:
        check_memlock(Layout(world, cfg.slots, cfg.max_bytes, ndev).total_bytes)
        transport = Transport(cfg, links, rank, world, buf, ndev)
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
