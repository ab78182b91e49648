/* What the C kernels share: per-CPU clones of the hot loops (and their inlined helpers), and work split over
 * threads.
 *
 * A kernel splits its work into contiguous ranges, one struct each in an array, and hands the array to
 * run_ranges, which runs the first range on the caller's thread and each other on a thread of its own
 * (or on the caller's, after the first, where a thread cannot start). thread_count decides how many
 * ranges are worth a thread: a thread costs tens of microseconds to start.
 */
#ifndef SEQZOO_KERNELS_PARALLEL_H
#define SEQZOO_KERNELS_PARALLEL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define CLONES
#endif

/* For the helpers of a CLONES function: inlined into each clone, so that their loops use its CPU's vectors
 * (a helper left as a call is compiled for the default CPU only). */
#if defined(__GNUC__)
#define ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define ALWAYS_INLINE inline
#endif

enum { MAX_THREADS = 256 };

/* How many threads to use: at most nthreads, one per item at the most, and one per min_work of the
 * total work (any unit, the same for both) beyond the first; between 1 and MAX_THREADS. */
static int64_t thread_count(int nthreads, int64_t items, double work, double min_work) {
    int64_t n = nthreads;
    if (min_work > 0 && (double)n > work / min_work + 1) n = (int64_t)(work / min_work) + 1;
    if (n > items) n = items;
    if (n > MAX_THREADS) n = MAX_THREADS;
    return n < 1 ? 1 : n;
}

/* task on each of the n structs of `size` bytes at `ranges` (see above). Returns 1 if a thread could not
 * be joined, else 0; each task reports its own failures in its struct. */
static int run_ranges(void *(*task)(void *), void *ranges, size_t size, int64_t n) {
    pthread_t threads[MAX_THREADS];
    char *range = ranges;
    int64_t started = 0;
    int status = 0;
    for (int64_t i = 1; i < n; i++, started++) {
        if (pthread_create(&threads[i], NULL, task, range + i * size) != 0) break;
    }
    task(range);
    for (int64_t i = started + 1; i < n; i++) task(range + i * size); /* threads that failed to start */
    for (int64_t i = 1; i <= started; i++) status |= pthread_join(threads[i], NULL) ? 1 : 0;
    return status;
}

#endif
