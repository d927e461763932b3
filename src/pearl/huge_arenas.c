/* CPython's small-object arenas on transparent huge pages, for simulation processes.
 *
 * CPython keeps objects of up to 512 bytes in 1 MiB arenas it maps itself; on a host that
 * grants 2 MiB pages only where a program asks (THP "madvise" mode, the common default)
 * they stay on 4 KiB pages, and a simulated fleet's heap of small objects then misses the
 * TLB on most first touches (pearl.processes.huge_pages). This arena allocator
 * (PyObject_SetArenaAllocator, a documented CPython hook) hands out arenas from 64 MiB
 * regions aligned to 2 MiB and marked MADV_HUGEPAGE. A freed arena is kept for the next
 * one instead of being unmapped: the process keeps its high-water mark of arenas.
 *
 * Built with the compiled modules (pearl.native) and installed by pearl.native.activate in
 * processes started with PEARL_HUGE_ARENAS=1. Pure allocation: no result depends on it.
 */
#include <Python.h>
#include <stdint.h>
#include <sys/mman.h>

#define REGION ((size_t)64 << 20)
#define HUGE_PAGE ((size_t)2 << 20)

static char *next = NULL, *end = NULL; /* the unused part of the current region */
static void *freed = NULL;             /* freed arenas, each linked through its first word */
static size_t arena_size = 0;          /* CPython asks for one size (ARENA_SIZE) */

static void *plain_map(size_t size)
{
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

static void *arena_alloc(void *ctx, size_t size)
{
    (void)ctx;
    if (arena_size == 0 && size > 0 && size <= REGION)
        arena_size = size;
    if (size != arena_size)
        return plain_map(size);
    if (freed != NULL) {
        void *p = freed;
        freed = *(void **)p;
        return p;
    }
    if (next == NULL || (size_t)(end - next) < size) {
        char *raw = mmap(NULL, REGION + HUGE_PAGE, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (raw == MAP_FAILED)
            return plain_map(size);
        next = (char *)(((uintptr_t)raw + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
        end = next + REGION;
        madvise(next, REGION, MADV_HUGEPAGE); /* advice: without it, 4 KiB pages */
    }
    void *p = next;
    next += size;
    return p;
}

static void arena_free(void *ctx, void *ptr, size_t size)
{
    (void)ctx;
    if (size != arena_size) { /* not one of ours (a size we never pooled) */
        munmap(ptr, size);
        return;
    }
    /* Arenas mapped before the hook was set have this size too: kept alike. */
    *(void **)ptr = freed;
    freed = ptr;
}

/* Install the allocator (called once, with the GIL held, through ctypes.PyDLL). */
int pearl_install_huge_arenas(void)
{
    PyObjectArenaAllocator allocator = {NULL, arena_alloc, arena_free};
    PyObject_SetArenaAllocator(&allocator);
    return 0;
}
