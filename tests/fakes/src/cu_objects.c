/* Opaque handles and the table of allocations of this process. */
#include <stdlib.h>
#include <string.h>

#include "cu.h"

pthread_mutex_t fc_obj_mutex = PTHREAD_MUTEX_INITIALIZER;

/* ---- handles: 0x7e | kind (8 bits) | generation (28 bits) | index (20 bits) ---- */
struct slot {
    int kind;
    uint32_t gen;
    void *data;
};
static struct slot *slots;
static uint32_t nslots, capslots;
static uint32_t free_head = UINT32_MAX; /* free list threaded through data */

#define H_TAG 0x7eull
#define H_IDX_BITS 20
#define H_GEN_BITS 28

static void *encode(int kind, uint32_t gen, uint32_t idx) {
    uint64_t v = (H_TAG << 56) | ((uint64_t)kind << 48) |
                 ((uint64_t)(gen & ((1u << H_GEN_BITS) - 1)) << H_IDX_BITS) | idx;
    return (void *)(uintptr_t)v;
}

void *fc_handle_new(int kind, void *data) {
    pthread_mutex_lock(&fc_obj_mutex);
    uint32_t idx;
    if (free_head != UINT32_MAX) {
        idx = free_head;
        free_head = (uint32_t)(uintptr_t)slots[idx].data;
    } else {
        if (nslots == capslots) {
            uint32_t cap = capslots ? capslots * 2 : 256;
            if (cap > (1u << H_IDX_BITS)) {
                pthread_mutex_unlock(&fc_obj_mutex);
                return NULL;
            }
            struct slot *n = realloc(slots, cap * sizeof *n);
            if (!n) {
                pthread_mutex_unlock(&fc_obj_mutex);
                return NULL;
            }
            slots = n;
            capslots = cap;
        }
        idx = nslots++;
        slots[idx].gen = 0;
    }
    slots[idx].kind = kind;
    slots[idx].gen++;
    slots[idx].data = data;
    void *h = encode(kind, slots[idx].gen, idx);
    pthread_mutex_unlock(&fc_obj_mutex);
    return h;
}

static int decode(const void *h, int *kind, uint32_t *gen, uint32_t *idx) {
    uint64_t v = (uint64_t)(uintptr_t)h;
    if ((v >> 56) != H_TAG) return 0;
    *kind = (int)((v >> 48) & 0xff);
    *gen = (uint32_t)((v >> H_IDX_BITS) & ((1u << H_GEN_BITS) - 1));
    *idx = (uint32_t)(v & ((1u << H_IDX_BITS) - 1));
    return 1;
}

void *fc_handle_get(const void *h, int kind) {
    int k;
    uint32_t gen, idx;
    if (!decode(h, &k, &gen, &idx) || k != kind) return NULL;
    void *data = NULL;
    pthread_mutex_lock(&fc_obj_mutex);
    if (idx < nslots && slots[idx].kind == kind &&
        (slots[idx].gen & ((1u << H_GEN_BITS) - 1)) == gen)
        data = slots[idx].data;
    pthread_mutex_unlock(&fc_obj_mutex);
    return data;
}

void fc_handle_free(const void *h) {
    int k;
    uint32_t gen, idx;
    if (!decode(h, &k, &gen, &idx)) return;
    pthread_mutex_lock(&fc_obj_mutex);
    if (idx < nslots && slots[idx].kind == k) {
        slots[idx].kind = 0;
        slots[idx].data = (void *)(uintptr_t)free_head;
        free_head = idx;
    }
    pthread_mutex_unlock(&fc_obj_mutex);
}

/* ---- allocation table: open addressing, linear probing, tombstones ---- */
#define TOMB ((struct fc_alloc *)1)
static struct fc_alloc **tab;
static size_t tcap, tused; /* tused counts live + tombstones */

static size_t hash(uint64_t k) { return (size_t)((k >> 9) * 0x9E3779B97F4A7C15ull); }

static void rehash(size_t cap) {
    struct fc_alloc **old = tab;
    size_t ocap = tcap;
    tab = calloc(cap, sizeof *tab);
    tcap = cap;
    tused = 0;
    for (size_t i = 0; i < ocap; i++) {
        if (old[i] && old[i] != TOMB) fc_alloc_put(old[i]);
    }
    free(old);
}

void fc_alloc_put(struct fc_alloc *a) {
    if ((tused + 1) * 2 > tcap) rehash(tcap ? tcap * 2 : 1024);
    size_t i = hash(a->key) & (tcap - 1);
    while (tab[i] && tab[i] != TOMB) i = (i + 1) & (tcap - 1);
    if (!tab[i]) tused++;
    tab[i] = a;
}

static size_t find(uint64_t key) {
    if (!tcap) return SIZE_MAX;
    size_t i = hash(key) & (tcap - 1);
    while (tab[i]) {
        if (tab[i] != TOMB && tab[i]->key == key) return i;
        i = (i + 1) & (tcap - 1);
    }
    return SIZE_MAX;
}

struct fc_alloc *fc_alloc_get(uint64_t key) {
    size_t i = find(key);
    return i == SIZE_MAX ? NULL : tab[i];
}

struct fc_alloc *fc_alloc_take(uint64_t key) {
    size_t i = find(key);
    if (i == SIZE_MAX) return NULL;
    struct fc_alloc *a = tab[i];
    tab[i] = TOMB;
    return a;
}

void fc_alloc_each(void (*fn)(struct fc_alloc *, void *), void *arg) {
    for (size_t i = 0; i < tcap; i++) {
        if (tab[i] && tab[i] != TOMB) fn(tab[i], arg);
    }
}

/* Freed linear addresses, handed out again to an allocation of the same size
 * (FAKECUDA_REUSE_ADDRESSES=1), the most recent first, as a real driver's allocator does. */
static struct { uint64_t addr, size; int low32; } freed[64];
static int nfreed;
static pthread_mutex_t freed_mutex = PTHREAD_MUTEX_INITIALIZER;

void fc_addr_free(uint64_t addr, uint64_t size, int low32) {
    if (!fc_knobs()->reuse_addresses) return;
    pthread_mutex_lock(&freed_mutex);
    if (nfreed == 64) memmove(freed, freed + 1, sizeof freed[0] * 63), nfreed--;
    freed[nfreed].addr = addr;
    freed[nfreed].size = size;
    freed[nfreed].low32 = low32;
    nfreed++;
    pthread_mutex_unlock(&freed_mutex);
}

static uint64_t reused(uint64_t size, int low32) {
    uint64_t a = 0;
    pthread_mutex_lock(&freed_mutex);
    for (int i = nfreed - 1; i >= 0; i--) {
        if (freed[i].size != size || freed[i].low32 != low32) continue;
        a = freed[i].addr;
        memmove(freed + i, freed + i + 1, sizeof freed[0] * (size_t)(nfreed - i - 1));
        nfreed--;
        break;
    }
    pthread_mutex_unlock(&freed_mutex);
    return a;
}

/* Fake device addresses: unique in this process (unless reused, above), never
 * dereferenced. */
uint64_t fc_addr_new(uint64_t size, uint64_t align, int low32) {
    if (fc_knobs()->reuse_addresses) {
        uint64_t a = reused(size, low32);
        if (a) return a;
    }
    static uint64_t next = 0x7f0000000000ull, next32 = 0x10000000ull;
    uint64_t *n = low32 ? &next32 : &next;
    if (align < 512) align = 512;
    uint64_t a = (*n + align - 1) & ~(align - 1);
    if (size == 0) size = 1;
    *n = a + ((size + 511) & ~511ull) + 512; /* a gap, so neighbours never touch */
    if (low32 && *n > 0xffff0000ull) return 0;
    return a;
}
