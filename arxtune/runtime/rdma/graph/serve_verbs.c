/* The verbs proxy's hot loop in C: poll the doorbell, wait for the step's
 * other parts, stamp the flag source, post each peer's payload + flag RDMA
 * writes (chained on one RC queue pair), reap the completions, advance SENT.
 *
 * Set-up stays in Python (pyverbs opens the device, registers the segment,
 * connects the QPs): native_verbs.py hands over the raw `struct ibv_qp *` /
 * `struct ibv_cq *` handles, and plans each (op, bytes, slot) once into an
 * arxg_vstep whose writes carry their addresses and keys. The loop returns
 * when a step has no entry yet (ARXG_MISS, key in out[0..2]), when it waited
 * idle_ns for a doorbell or a part (ARXG_IDLE: the caller checks its parent
 * and calls again; SENT says where to resume; it waits by arxg_wait.h's policy), on a failed post or an error
 * completion (ARXG_FAILED) and when completions do not come within
 * timeout_ns (ARXG_TIMEOUT). Verbs calls go through an arxg_verbs_ops table:
 * arxg_verbs_real_ops() for libibverbs, a fake in the tests.
 *
 * Memory order (docs/arxg-ordering.md): acquire loads of the doorbell and the
 * bells; a full fence between them (and the flag-source stamp) and the first
 * ibv_post_send; a release store of SENT after the completions were reaped. */
#include <sched.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include <infiniband/verbs.h>

#include "arxg_wait.h"

#define ARXG_MAX_PARTS 256
#define ARXG_MAX_POSTS 32 /* (peer, device) pairs a step can reach */
#define ARXG_POLL_BATCH 16

enum { ARXG_IDLE = 0, ARXG_MISS = 1, ARXG_FAILED = 2, ARXG_TIMEOUT = 3 };
enum { ARXG_FAILED_POST = 0, ARXG_FAILED_COMPLETION = 1 };

/* One RDMA write: local source, remote destination, keys; `signaled` asks for a completion. */
typedef struct { uint64_t laddr, raddr; uint32_t length, lkey, rkey, signaled; } arxg_write;
/* What the loop needs of a work completion. */
typedef struct { uint64_t wr_id; uint32_t status, vendor_err, qp_num, pad; } arxg_completion;

typedef struct {
    /* Post n writes on qp, in order, as one chain, each with wr_id; 0 or an errno. */
    int (*post)(void *qp, const arxg_write *writes, int n, uint64_t wr_id);
    /* Up to n completions from cq into out; how many, or < 0 on error (as ibv_poll_cq). */
    int (*poll)(void *cq, int n, arxg_completion *out);
} arxg_verbs_ops;

/* One chained post: up to two writes (payload, then flag) on queue pair qps[qp]. */
typedef struct { int64_t qp, nwrites; arxg_write writes[2]; } arxg_post;
/* A planned step: its key, the word its flag writes send (the flag source), its posts. */
typedef struct { int64_t op, nbytes, slot, nposts; int64_t *flag_src; arxg_post posts[ARXG_MAX_POSTS]; } arxg_vstep;

typedef struct {
    int64_t *ctrl; /* the segment's control words; the rest are word indices into it */
    int64_t doorbell, desc, parts, bells, sent, heartbeat, slots;
    void *const *qps; /* raw queue-pair handles, indexed by arxg_post.qp */
    void *const *cqs; /* every completion queue the posts complete on */
    int64_t ncqs;
    const arxg_verbs_ops *ops;
    arxg_wait *wait; /* the wait policy (arxg_wait.h) */
    int64_t reap_spins, idle_ns, timeout_ns;
} arxg_verbs_loop;

static const arxg_vstep *find(const arxg_vstep *steps, int64_t n, int64_t op, int64_t nbytes, int64_t slot) {
    for (int64_t i = 0; i < n; i++)
        if (steps[i].op == op && steps[i].nbytes == nbytes && steps[i].slot == slot) return &steps[i];
    return 0;
}

/* Post a step's writes and reap one completion per post; ARXG_IDLE (0) when all succeeded. */
static int64_t send_step(const arxg_verbs_loop *L, const arxg_vstep *s, uint64_t step, int64_t *out) {
    for (int64_t i = 0; i < s->nposts; i++) {
        const arxg_post *p = &s->posts[i];
        int rc = L->ops->post(L->qps[p->qp], p->writes, (int)p->nwrites, step);
        if (rc) {
            out[0] = ARXG_FAILED_POST, out[1] = rc, out[2] = 0, out[3] = p->qp;
            return ARXG_FAILED;
        }
    }
    int64_t pending = s->nposts, n = 0, start = 0;
    arxg_completion wc[ARXG_POLL_BATCH];
    while (pending > 0) {
        for (int64_t c = 0; c < L->ncqs && pending > 0; c++) {
            int got = L->ops->poll(L->cqs[c], ARXG_POLL_BATCH, wc);
            if (got < 0) {
                out[0] = ARXG_FAILED_COMPLETION, out[1] = -1, out[2] = 0, out[3] = -1;
                return ARXG_FAILED;
            }
            for (int k = 0; k < got; k++) {
                if (wc[k].status) {
                    out[0] = ARXG_FAILED_COMPLETION, out[1] = wc[k].status, out[2] = wc[k].vendor_err;
                    out[3] = wc[k].qp_num;
                    return ARXG_FAILED;
                }
                if (wc[k].wr_id == step) pending--;
            }
        }
        if (pending <= 0) break;
        if (++n <= L->reap_spins) continue;
        sched_yield(); /* a software NIC (rxe) needs the CPU this loop would take */
        int64_t t = arxg_now_ns();
        if (!start) start = t;
        else if (t - start > L->timeout_ns) {
            out[0] = (int64_t)step, out[1] = pending;
            return ARXG_TIMEOUT;
        }
    }
    return ARXG_IDLE;
}

int64_t arxg_serve_verbs(const arxg_verbs_loop *L, const arxg_vstep *steps, int64_t nsteps, int64_t *out) {
    int64_t *ctrl = L->ctrl;
    int64_t done = __atomic_load_n(&ctrl[L->sent], __ATOMIC_ACQUIRE);
    for (;;) {
        if (!arxg_wait_at_least(L->wait, &ctrl[L->doorbell], done + 1, L->idle_ns)) return ARXG_IDLE;
        int64_t rung = __atomic_load_n(&ctrl[L->doorbell], __ATOMIC_ACQUIRE);
        for (int64_t seq = done + 1; seq <= rung; seq++) {
            int64_t slot = (seq - 1) % L->slots;
            /* written before the doorbell's release store; our acquire of the doorbell orders these reads */
            int64_t op = __atomic_load_n(&ctrl[L->desc + 2 * slot], __ATOMIC_RELAXED);
            int64_t nbytes = __atomic_load_n(&ctrl[L->desc + 2 * slot + 1], __ATOMIC_RELAXED);
            int64_t parts = __atomic_load_n(&ctrl[L->parts + slot], __ATOMIC_RELAXED);
            if (parts > ARXG_MAX_PARTS) parts = ARXG_MAX_PARTS;
            for (int64_t p = 1; p < parts; p++)
                if (!arxg_wait_at_least(L->wait, &ctrl[L->bells + p], seq, L->idle_ns)) return ARXG_IDLE;
            const arxg_vstep *s = find(steps, nsteps, op, nbytes, slot);
            if (!s) {
                out[0] = op, out[1] = nbytes, out[2] = slot;
                return ARXG_MISS;
            }
            if (s->flag_src) __atomic_store_n(s->flag_src, seq, __ATOMIC_RELAXED);
            /* Everything the bells published, and the stamp above, before the NIC is told to read. */
            __atomic_thread_fence(__ATOMIC_SEQ_CST);
            int64_t rc = send_step(L, s, (uint64_t)(seq - 1), out);
            if (rc != ARXG_IDLE) return rc;
            /* The completions say the NIC has read the staging: the rank may reuse the slot. */
            __atomic_store_n(&ctrl[L->sent], seq, __ATOMIC_RELEASE);
            L->wait->active = arxg_now_ns();
            __atomic_store_n(&ctrl[L->heartbeat], L->wait->active, __ATOMIC_RELAXED);
            done = seq;
        }
    }
}

/* ---- libibverbs --------------------------------------------------------------------------- */
static int real_post(void *qp, const arxg_write *writes, int n, uint64_t wr_id) {
    struct ibv_sge sge[2];
    struct ibv_send_wr wr[2], *bad = 0;
    if (n < 1 || n > 2) return 22; /* EINVAL */
    memset(wr, 0, sizeof wr);
    for (int i = 0; i < n; i++) {
        sge[i].addr = writes[i].laddr, sge[i].length = writes[i].length, sge[i].lkey = writes[i].lkey;
        wr[i].wr_id = wr_id, wr[i].sg_list = &sge[i], wr[i].num_sge = 1, wr[i].opcode = IBV_WR_RDMA_WRITE;
        wr[i].send_flags = writes[i].signaled ? IBV_SEND_SIGNALED : 0;
        wr[i].wr.rdma.remote_addr = writes[i].raddr, wr[i].wr.rdma.rkey = writes[i].rkey;
        wr[i].next = i + 1 < n ? &wr[i + 1] : 0;
    }
    return ibv_post_send((struct ibv_qp *)qp, wr, &bad);
}

static int real_poll(void *cq, int n, arxg_completion *out) {
    struct ibv_wc wc[ARXG_POLL_BATCH];
    int got = ibv_poll_cq((struct ibv_cq *)cq, n < ARXG_POLL_BATCH ? n : ARXG_POLL_BATCH, wc);
    for (int i = 0; i < got; i++) {
        out[i].wr_id = wc[i].wr_id, out[i].status = wc[i].status, out[i].vendor_err = wc[i].vendor_err;
        out[i].qp_num = wc[i].qp_num, out[i].pad = 0;
    }
    return got;
}

static const arxg_verbs_ops real_ops = {real_post, real_poll};

const arxg_verbs_ops *arxg_verbs_real_ops(void) { return &real_ops; }

/* Where struct ibv_qp / ibv_cq keep what native_verbs.py checks before it trusts a handle. */
void arxg_verbs_layout(int64_t *out) {
    out[0] = sizeof(struct ibv_qp);
    out[1] = offsetof(struct ibv_qp, context);
    out[2] = offsetof(struct ibv_qp, send_cq);
    out[3] = offsetof(struct ibv_qp, qp_num);
    out[4] = offsetof(struct ibv_qp, qp_type);
    out[5] = sizeof(struct ibv_cq);
    out[6] = offsetof(struct ibv_cq, context);
    out[7] = IBV_QPT_RC;
}
