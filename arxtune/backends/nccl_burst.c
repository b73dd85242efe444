/* Back-to-back NCCL launches from C, as nccl-tests launches them: an eager
 * sample then times NCCL's own enqueue, not the interpreter's call overhead.
 * `fn` is ncclAllReduce / ncclReduceScatter (reduces != 0: they take a
 * reduction) or ncclAllGather; call i runs on buffer pair i % pairs. */
#include <stddef.h>

typedef int (*reducing_fn)(const void *, void *, size_t, int, int, void *, void *);
typedef int (*plain_fn)(const void *, void *, size_t, int, void *, void *);

int arxtune_nccl_burst(void *fn, int reduces, void *const *send, void *const *recv, int pairs, size_t count,
                       int dtype, int op, void *comm, void *stream, int calls) {
    for (int i = 0; i < calls; i++) {
        int p = i % pairs;
        int rc = reduces ? ((reducing_fn)fn)(send[p], recv[p], count, dtype, op, comm, stream)
                         : ((plain_fn)fn)(send[p], recv[p], count, dtype, comm, stream);
        if (rc) return rc;
    }
    return 0;
}
