/* The proxy's wait policy, shared by its C loops (serve_shm.c, serve_verbs.c): poll for the next step for a
 * window after the last activity, then block.
 *
 * Polling answers a doorbell within a cache miss, but takes a CPU core. For `spin_ns` after the loop last
 * sent a step (or was woken) it polls, yielding the CPU now and then so that more pollers than cores do not
 * starve each other; after that it blocks in a futex wait on the segment's WAKE word for at most `nap_ns`
 * between polls. The GPU cannot wake a futex, so a step rung while the proxy blocks waits for the end of
 * the nap; an eager call, whose host side runs before its kernel, wakes the proxy itself (cuda_launch.c:
 * it reads ASLEEP, bumps WAKE and wakes it), which restarts the window. */
#ifndef ARXG_WAIT_H
#define ARXG_WAIT_H

#include <linux/futex.h>
#include <sched.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    int64_t spin_ns;  /* poll this long after the last activity */
    int64_t nap_ns;   /* then block at most this long between polls */
    int32_t *asleep;  /* 1 while blocked (the segment's ASLEEP word) */
    int32_t *wake;    /* the futex word an eager call bumps (WAKE) */
    int64_t *beat;    /* the heartbeat word */
    int64_t active;   /* CLOCK_MONOTONIC ns of the last activity: the loops set it */
    int64_t naps, wakes; /* counts, for the benchmarks: naps taken, naps ended by a wake */
} arxg_wait;

static int64_t arxg_now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* How long to block after a poll that found nothing, `idle` ns after the last activity: 0 = poll again. */
int64_t arxg_wait_nap(int64_t idle, int64_t spin_ns, int64_t nap_ns) {
    return idle < spin_ns ? 0 : nap_ns;
}

/* Block up to `ns` unless *word has reached `want`; 1 if an eager call woke it (the window restarts). */
static int arxg_block(arxg_wait *w, const int64_t *word, int64_t want, int64_t ns) {
    int32_t seen = __atomic_load_n(w->wake, __ATOMIC_SEQ_CST);
    __atomic_store_n(w->asleep, 1, __ATOMIC_SEQ_CST);
    int woken = 0;
    if (__atomic_load_n(word, __ATOMIC_ACQUIRE) < want) {
        struct timespec t = {ns / 1000000000, ns % 1000000000};
        w->naps++;
        syscall(SYS_futex, w->wake, FUTEX_WAIT, seen, &t, 0, 0);
        woken = __atomic_load_n(w->wake, __ATOMIC_SEQ_CST) != seen;
        w->wakes += woken;
    }
    __atomic_store_n(w->asleep, 0, __ATOMIC_SEQ_CST);
    return woken;
}

/* Wait until *word >= want (acquire), by the policy; 0 once it has waited idle_ns without it (the caller then
 * checks that its parent lives and calls again). The clock is read every 1024 polls, and the heartbeat gets it. */
static int arxg_wait_at_least(arxg_wait *w, const int64_t *word, int64_t want, int64_t idle_ns) {
    int64_t n = 0, since = 0;
    while (__atomic_load_n(word, __ATOMIC_ACQUIRE) < want) {
        if ((++n & 1023) != 0) continue;
        int64_t t = arxg_now_ns();
        __atomic_store_n(w->beat, t, __ATOMIC_RELAXED);
        if (!since) since = t;
        else if (t - since > idle_ns) return 0;
        int64_t nap = arxg_wait_nap(t - w->active, w->spin_ns, w->nap_ns);
        if (nap) {
            if (arxg_block(w, word, want, nap)) w->active = arxg_now_ns();
            n = 1023; /* the next poll reads the clock again */
        } else if ((n & 8191) == 0) {
            sched_yield();
        }
    }
    return 1;
}

#endif
