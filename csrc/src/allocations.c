/* This process's allocations: one table per kind of record (pointers, arrays, VMM
 * handles and mappings, pools, contexts, graph executables), each key to its record,
 * under one lock. What a record is charged lives in the usage state (state.c); a
 * forgotten record is released here. Below every hook file (cuda_*.c), which all keep
 * their records here: none of them needs another's internals to find one. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "shim.h"

VG_MUTEX(table_mu);
static vg_alloc_table tables[VG_T_N];

int vg_remember(int table, vg_alloc a)
{
    vg_lock(&table_mu);
    int r = vg_table_put(&tables[table], a);
    vg_unlock(&table_mu);
    if (r) VG_ERROR("allocation table full: %llu bytes will stay charged",
                    (unsigned long long)a.bytes);
    return r;
}

/* A forked child owns none of its parent's allocations (CUDA does not carry into a
 * fork), and a table another thread was changing at the fork may be half-changed. */
void vg_allocations_after_fork(void)
{
    memset(tables, 0, sizeof tables); /* the parent's slots are left to the parent */
}

int vg_forget(int table, uint64_t key, vg_alloc *out)
{
    vg_lock(&table_mu);
    int r = vg_table_take(&tables[table], key, out);
    vg_unlock(&table_mu);
    return r;
}

int vg_peek(int table, uint64_t key, vg_alloc *out)
{
    vg_lock(&table_mu);
    int r = vg_table_peek(&tables[table], key, out);
    vg_unlock(&table_mu);
    return r;
}

int vg_mark(int table, uint64_t key, int32_t flags)
{
    vg_alloc_table *t = &tables[table];
    vg_alloc a;
    vg_lock(&table_mu);
    int found = vg_table_peek(t, key, &a);
    if (found && (a.flags & flags) != flags) {
        a.flags |= flags;
        vg_table_put(t, a); /* the same key: replaced in place */
    }
    vg_unlock(&table_mu);
    return found;
}

void vg_each(int table, int (*fn)(vg_alloc *a, void *arg), void *arg)
{
    /* a snapshot: fn may call back into the tables */
    vg_alloc_table *t = &tables[table];
    vg_lock(&table_mu);
    size_t n = 0;
    vg_alloc *copy = t->len ? malloc(t->len * sizeof *copy) : NULL;
    for (size_t i = 0; copy && i < t->cap; i++)
        if (t->slots[i].key) copy[n++] = t->slots[i];
    vg_unlock(&table_mu);
    if (t->len && !copy) VG_ERROR("out of memory walking the allocation table");
    for (size_t i = 0; i < n; i++)
        if (fn(&copy[i], arg)) vg_forget(table, copy[i].key, NULL);
    free(copy);
}

void vg_rekey_ctx(int table, uint64_t from, uint64_t to)
{
    vg_alloc_table *t = &tables[table];
    vg_lock(&table_mu);
    for (size_t i = 0; i < t->cap; i++)
        if (t->slots[i].key && t->slots[i].ctx == from) t->slots[i].ctx = to;
    vg_unlock(&table_mu);
}

uint64_t vg_current_ctx(void)
{
    CUcontext c = NULL;
    if (!vg_real.cuCtxGetCurrent || vg_real.cuCtxGetCurrent(&c) != CUDA_SUCCESS) return 0;
    return (uint64_t)(uintptr_t)c;
}

void vg_release(const vg_alloc *a)
{
    if (a->kind == VG_KIND_SPILL) vg_state_uncharge(a->dev, a->bytes, VG_KIND_SPILL);
    else if (a->kind != VG_KIND_POOL) vg_state_uncharge(a->dev, a->bytes, VG_KIND_DEVICE);
}
