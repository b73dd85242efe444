/* Back-to-back NCCL launches from C, as nccl-tests launches them: an eager
 * sample then times NCCL's own enqueue, not the interpreter's call overhead.
 * `fn` is ncclAllReduce / ncclReduceScatter (reduces != 0: they take a
 * reduction) or ncclAllGather; call i runs on buffer pair i % pairs. Where
 * `record` (cuEventRecord) is given, events `start` and `end` are recorded on
 * the stream right before the first launch and right after the last, so the
 * interval holds the launches alone. Where `before` is given, before(before_arg,
 * stream) runs ahead of each call (the decode view's busy kernel: arxtune_launch
 * of runtime/cuda_launch.c). Returns 0, NCCL's error code, or minus the CUDA
 * error code of a failed record or `before`. */
#include <stddef.h>

typedef int (*reducing_fn)(const void *, void *, size_t, int, int, void *, void *);
typedef int (*plain_fn)(const void *, void *, size_t, int, void *, void *);
typedef int (*record_fn)(void *, void *);
typedef int (*before_fn)(const void *, void *);

int arxtune_nccl_burst(void *fn, int reduces, void *const *send, void *const *recv, int pairs, size_t count,
                       int dtype, int op, void *comm, void *stream, int calls, void *record, void *start, void *end,
                       void *before, const void *before_arg) {
    int rc;
    if (record && (rc = ((record_fn)record)(start, stream))) return -rc;
    for (int i = 0; i < calls; i++) {
        int p = i % pairs;
        if (before && (rc = ((before_fn)before)(before_arg, stream))) return -rc;
        rc = reduces ? ((reducing_fn)fn)(send[p], recv[p], count, dtype, op, comm, stream)
                     : ((plain_fn)fn)(send[p], recv[p], count, dtype, comm, stream);
        if (rc) return rc;
    }
    if (record && (rc = ((record_fn)record)(end, stream))) return -rc;
    return 0;
}
