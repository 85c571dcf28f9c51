/* Pure accounting helpers: limit checks, size estimates for pitched and array
 * allocations, and the per-process table of live allocations. No I/O, no driver
 * calls; unit-tested by tests/shim/progs/test_unit.c. */
#include <stdlib.h>
#include <string.h>

#include "shim.h"

int vg_budget_fits(uint64_t used, uint64_t request, uint64_t limit)
{
    if (limit == 0) return 1;
    if (used > limit) return 0;
    return request <= limit - used;
}

#define VG_PITCH_ALIGN 512u

uint64_t vg_pitch_bytes(size_t width, size_t height, size_t *pitch_out)
{
    uint64_t pitch = ((uint64_t)width + VG_PITCH_ALIGN - 1) / VG_PITCH_ALIGN * VG_PITCH_ALIGN;
    if (pitch_out) *pitch_out = (size_t)pitch;
    if (height && pitch > UINT64_MAX / height) return UINT64_MAX;
    return pitch * (uint64_t)height;
}

static unsigned format_bytes(int format)
{
    switch (format) {
    case CU_AD_FORMAT_UNSIGNED_INT8: case CU_AD_FORMAT_SIGNED_INT8: return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16: case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF: return 2;
    case CU_AD_FORMAT_UNSIGNED_INT32: case CU_AD_FORMAT_SIGNED_INT32:
    case CU_AD_FORMAT_FLOAT: return 4;
    default: return 4; /* packed/compressed formats: at most 4 bytes per element */
    }
}

static uint64_t mul_sat(uint64_t a, uint64_t b)
{
    if (a && b > UINT64_MAX / a) return UINT64_MAX;
    return a * b;
}

uint64_t vg_array_bytes(size_t w, size_t h, size_t d, int format, unsigned channels)
{
    uint64_t n = mul_sat(w ? w : 1, h ? h : 1);
    n = mul_sat(n, d ? d : 1);
    n = mul_sat(n, format_bytes(format));
    n = mul_sat(n, channels ? channels : 1);
    return n;
}

uint64_t vg_mipmap_bytes(size_t w, size_t h, size_t d, int format, unsigned channels,
                         unsigned levels)
{
    uint64_t total = 0;
    if (levels == 0) levels = 1;
    for (unsigned i = 0; i < levels && i < 64; i++) {
        uint64_t b = vg_array_bytes(w, h, d, format, channels);
        total = total > UINT64_MAX - b ? UINT64_MAX : total + b;
        w = w > 1 ? w / 2 : 1;
        h = h > 1 ? h / 2 : h;
        d = d > 1 ? d / 2 : d;
    }
    return total;
}

/* Open addressing with linear probing; key 0 marks an empty slot (no device pointer
 * or handle the driver returns is 0), deletion uses backward shift. */
static size_t hash_key(uint64_t k, size_t cap)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return (size_t)k & (cap - 1);
}

static int grow(vg_alloc_table *t)
{
    size_t ncap = t->cap ? t->cap * 2 : 64;
    vg_alloc *ns = calloc(ncap, sizeof *ns);
    if (!ns) return -1;
    for (size_t i = 0; i < t->cap; i++) {
        if (!t->slots[i].key) continue;
        size_t j = hash_key(t->slots[i].key, ncap);
        while (ns[j].key) j = (j + 1) & (ncap - 1);
        ns[j] = t->slots[i];
    }
    free(t->slots);
    t->slots = ns;
    t->cap = ncap;
    return 0;
}

int vg_table_put(vg_alloc_table *t, vg_alloc a)
{
    if (a.key == 0) return -1;
    if ((t->len + 1) * 4 > t->cap * 3 && grow(t)) return -1;
    size_t j = hash_key(a.key, t->cap);
    while (t->slots[j].key && t->slots[j].key != a.key) j = (j + 1) & (t->cap - 1);
    if (!t->slots[j].key) t->len++;
    t->slots[j] = a;
    return 0;
}

int vg_table_peek(const vg_alloc_table *t, uint64_t key, vg_alloc *out)
{
    if (!t->cap || key == 0) return 0;
    size_t j = hash_key(key, t->cap);
    while (t->slots[j].key) {
        if (t->slots[j].key == key) {
            if (out) *out = t->slots[j];
            return 1;
        }
        j = (j + 1) & (t->cap - 1);
    }
    return 0;
}

int vg_table_take(vg_alloc_table *t, uint64_t key, vg_alloc *out)
{
    if (!t->cap || key == 0) return 0;
    size_t mask = t->cap - 1, j = hash_key(key, t->cap);
    while (t->slots[j].key && t->slots[j].key != key) j = (j + 1) & mask;
    if (!t->slots[j].key) return 0;
    if (out) *out = t->slots[j];
    /* backward-shift deletion keeps probe chains intact without tombstones */
    size_t i = j;
    for (;;) {
        t->slots[i].key = 0;
        size_t k = i;
        for (;;) {
            k = (k + 1) & mask;
            if (!t->slots[k].key) {
                t->len--;
                return 1;
            }
            size_t home = hash_key(t->slots[k].key, t->cap);
            /* move k into i if its home is not in (i, k] cyclically */
            int between = i <= k ? (home > i && home <= k) : (home > i || home <= k);
            if (!between) break;
        }
        t->slots[i] = t->slots[k];
        i = k;
    }
}

void vg_table_free(vg_alloc_table *t)
{
    free(t->slots);
    memset(t, 0, sizeof *t);
}
