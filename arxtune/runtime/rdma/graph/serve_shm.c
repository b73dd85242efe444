/* The shared-memory proxy's hot loop in C: poll the doorbell, wait for the
 * step's other parts, store the step's flag at each peer (the peers read the
 * payload from this rank's staging slot), advance SENT.
 *
 * Python (native.py) owns everything else: it plans each (op, bytes, slot) once
 * and hands the flag addresses over in `steps`; the loop returns when a step has
 * no entry yet (ARXG_MISS, the key in miss[]) or when it has waited idle_ns for
 * a doorbell or a part (ARXG_IDLE: the caller checks that its parent lives and
 * calls again; SENT says where to resume). It waits by the policy in
 * arxg_wait.h: polling for a window after the last step, then blocking. Acquire loads of the bells and
 * release stores of the flags carry the rank's staging to the peers. The loop
 * stores the time in ctrl[heartbeat] while it waits and after the steps it
 * sends: the rank reads the proxy's liveness there. */
#include <stdint.h>

#include "arxg_wait.h"

#define ARXG_MAX_FLAGS 16
#define ARXG_MAX_PARTS 256
#define ARXG_IDLE 0
#define ARXG_MISS 1

typedef struct { int64_t op, nbytes, slot, nflags; int64_t flags[ARXG_MAX_FLAGS]; } arxg_step;

static const arxg_step *find(const arxg_step *steps, int64_t n, int64_t op, int64_t nbytes, int64_t slot) {
    for (int64_t i = 0; i < n; i++)
        if (steps[i].op == op && steps[i].nbytes == nbytes && steps[i].slot == slot) return &steps[i];
    return 0;
}

int64_t arxg_serve_shm(int64_t *ctrl, int64_t doorbell, int64_t desc, int64_t parts_at, int64_t bells, int64_t sent,
                       int64_t slots, const arxg_step *steps, int64_t nsteps, arxg_wait *w, int64_t idle_ns,
                       int64_t *miss) {
    int64_t done = __atomic_load_n(&ctrl[sent], __ATOMIC_ACQUIRE);
    int64_t *beat = w->beat;
    __atomic_store_n(beat, arxg_now_ns(), __ATOMIC_RELAXED);
    for (;;) {
        if (!arxg_wait_at_least(w, &ctrl[doorbell], done + 1, idle_ns)) return ARXG_IDLE;
        int64_t rung = __atomic_load_n(&ctrl[doorbell], __ATOMIC_ACQUIRE);
        for (int64_t seq = done + 1; seq <= rung; seq++) {
            int64_t slot = (seq - 1) % slots;
            int64_t op = __atomic_load_n(&ctrl[desc + 2 * slot], __ATOMIC_RELAXED);
            int64_t nbytes = __atomic_load_n(&ctrl[desc + 2 * slot + 1], __ATOMIC_RELAXED);
            int64_t parts = __atomic_load_n(&ctrl[parts_at + slot], __ATOMIC_RELAXED);
            if (parts > ARXG_MAX_PARTS) parts = ARXG_MAX_PARTS;
            for (int64_t p = 1; p < parts; p++)
                if (!arxg_wait_at_least(w, &ctrl[bells + p], seq, idle_ns)) return ARXG_IDLE;
            const arxg_step *s = find(steps, nsteps, op, nbytes, slot);
            if (!s) {
                miss[0] = op, miss[1] = nbytes, miss[2] = slot;
                return ARXG_MISS;
            }
            for (int64_t i = 0; i < s->nflags; i++) __atomic_store_n((int64_t *)s->flags[i], seq, __ATOMIC_RELEASE);
            __atomic_store_n(&ctrl[sent], seq, __ATOMIC_RELEASE);
            done = seq;
        }
        w->active = arxg_now_ns();
        __atomic_store_n(beat, w->active, __ATOMIC_RELAXED);
    }
}
