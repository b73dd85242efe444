/* Kernel launches from C through the CUDA driver (cuLaunchKernel), arguments packed once.
 *
 * An arxtune_launch holds one kernel, its grid and its packed arguments; Python
 * (cudadrv.py) fills it once per buffer pair and calls arxtune_launch() per call,
 * or arxtune_launch_burst() for a run of calls launched back to back (a timed
 * sample). The driver's entry points arrive as pointers, so this file builds
 * without CUDA's headers or libcuda (and cross-compiles for aarch64).
 *
 * A launch may name a proxy to wake first: where `asleep` says the proxy
 * blocks in a futex wait on `wake`, the call bumps `wake` and wakes it, so the
 * proxy spins again by the time the kernel rings (rdma/graph/arxg_wait.h). */
#include <linux/futex.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <unistd.h>

typedef int (*cu_launch_kernel)(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                                unsigned shared, void *stream, void **params, void **extra);
typedef int (*cu_ctx_set_current)(void *ctx);
typedef int (*cu_event_record)(void *event, void *stream);

typedef struct {
    cu_launch_kernel launch;
    cu_ctx_set_current set_ctx; /* NULL: the calling thread's current context serves */
    void *ctx;
    void *func;
    uint32_t grid[3], block[3];
    uint32_t shared, pad;
    void **params;
    int32_t *asleep, *wake; /* a proxy to wake before launching, or NULL */
} arxtune_launch_t;

static int launch_one(const arxtune_launch_t *l, void *stream) {
    if (l->asleep && __atomic_load_n(l->asleep, __ATOMIC_SEQ_CST)) {
        __atomic_add_fetch(l->wake, 1, __ATOMIC_SEQ_CST);
        syscall(SYS_futex, l->wake, FUTEX_WAKE, 1, 0, 0, 0);
    }
    return l->launch(l->func, l->grid[0], l->grid[1], l->grid[2], l->block[0], l->block[1], l->block[2], l->shared,
                     stream, l->params, 0);
}

/* One launch on `stream`: 0 or the driver's error. */
int arxtune_launch(const arxtune_launch_t *l, void *stream) {
    int rc;
    if (l->set_ctx && (rc = l->set_ctx(l->ctx))) return rc;
    return launch_one(l, stream);
}

/* `calls` launches back to back, the i-th from calls[i % count], each after `before` where given (a busy
 * kernel: the decode view); events `start` and `end` recorded around them where `record` is given.
 * 0 or the first error. */
int arxtune_launch_burst(const arxtune_launch_t *const *launches, int count, int calls, const arxtune_launch_t *before,
                         void *stream, cu_event_record record, void *start, void *end) {
    int rc;
    const arxtune_launch_t *first = before ? before : launches[0];
    if (first->set_ctx && (rc = first->set_ctx(first->ctx))) return rc;
    if (record && (rc = record(start, stream))) return rc;
    for (int i = 0; i < calls; i++) {
        if (before && (rc = launch_one(before, stream))) return rc;
        if (count && (rc = launch_one(launches[i % count], stream))) return rc;
    }
    if (record && (rc = record(end, stream))) return rc;
    return 0;
}
