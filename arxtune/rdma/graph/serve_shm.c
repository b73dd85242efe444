/* The shared-memory proxy's hot loop in C: poll the doorbell, copy each staged
 * step into the peers' inboxes, store their flags, advance SENT.
 *
 * Python (native.py) owns everything else: it plans each (op, bytes, slot) once
 * and hands the copies over in `steps`; the loop returns when a step has no
 * entry yet (ARXG_MISS, the key in miss[]) or when it has idled for idle_ns
 * (ARXG_IDLE: the caller checks that its parent lives). x86-64 keeps stores in
 * program order, so a peer that sees a flag sees the payload before it; the
 * release stores also keep the compiler from reordering them. */
#include <sched.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#define ARXG_MAX_PUTS 16
#define ARXG_IDLE 0
#define ARXG_MISS 1

typedef struct { int64_t dst, src, nbytes, flag; } arxg_put;
typedef struct { int64_t op, nbytes, slot, nputs; arxg_put puts[ARXG_MAX_PUTS]; } arxg_step;

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static const arxg_step *find(const arxg_step *steps, int64_t n, int64_t op, int64_t nbytes, int64_t slot) {
    for (int64_t i = 0; i < n; i++)
        if (steps[i].op == op && steps[i].nbytes == nbytes && steps[i].slot == slot) return &steps[i];
    return 0;
}

int64_t arxg_serve_shm(int64_t *ctrl, int64_t doorbell, int64_t desc, int64_t sent, int64_t slots,
                       const arxg_step *steps, int64_t nsteps, int64_t spins_before_yield, int64_t idle_ns,
                       int64_t *miss) {
    int64_t done = __atomic_load_n(&ctrl[sent], __ATOMIC_ACQUIRE), idle = 0, idle_since = 0;
    for (;;) {
        int64_t rung = __atomic_load_n(&ctrl[doorbell], __ATOMIC_ACQUIRE);
        if (rung == done) {
            if (++idle > spins_before_yield) {
                sched_yield();
                if ((idle & 255) == 0) {
                    int64_t t = now_ns();
                    if (!idle_since) idle_since = t;
                    else if (t - idle_since > idle_ns) return ARXG_IDLE;
                }
            }
            continue;
        }
        idle = idle_since = 0;
        for (int64_t seq = done + 1; seq <= rung; seq++) {
            int64_t slot = (seq - 1) % slots;
            int64_t op = __atomic_load_n(&ctrl[desc + 2 * slot], __ATOMIC_RELAXED);
            int64_t nbytes = __atomic_load_n(&ctrl[desc + 2 * slot + 1], __ATOMIC_RELAXED);
            const arxg_step *s = find(steps, nsteps, op, nbytes, slot);
            if (!s) {
                miss[0] = op, miss[1] = nbytes, miss[2] = slot;
                return ARXG_MISS;
            }
            for (int64_t i = 0; i < s->nputs; i++) {
                const arxg_put *p = &s->puts[i];
                memcpy((void *)p->dst, (const void *)p->src, (size_t)p->nbytes);
                __atomic_store_n((int64_t *)p->flag, seq, __ATOMIC_RELEASE);
            }
            __atomic_store_n(&ctrl[sent], seq, __ATOMIC_RELEASE);
        }
        done = rung;
    }
}
