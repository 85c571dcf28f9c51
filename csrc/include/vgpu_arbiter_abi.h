/* The per-GPU arbitration record: the plugin -> every shim on that GPU. Version 1.
 *
 * <arbiter_dir>/<gpu-uuid>, VG_ARB_SIZE bytes, created by the plugin and rewritten in
 * place (never replaced: the shims keep it mapped), mounted read-only into every GPU
 * container. The plugin sees every container's activity on the GPU (NVML, host view);
 * a container sees only its own. It publishes the highest priority among the
 * containers active on the GPU; a shim whose own priority (from its read-only config)
 * is lower holds its SM rate at floor_permille until that changes.
 *
 * Writes follow a sequence lock: seq is made odd, the fields written, seq made even.
 * A reader that sees an odd seq, or a different seq after reading, reads again. A
 * record not published for 3 periods (the plugin stopped) is ignored: a dead arbiter
 * must not hold anyone at the floor. Python's view: vgpud/node/arbiter.py. */
#ifndef VGPU_ARBITER_ABI_H
#define VGPU_ARBITER_ABI_H

#include <stddef.h>
#include <stdint.h>

#define VG_ARB_MAGIC 0x3162726167707601ULL /* "\x01vpgarb1" little-endian, arbitrary */
#define VG_ARB_VERSION 1u
#define VG_ARB_SIZE 64

typedef struct vg_arbiter_record {
    uint64_t magic;          /*  0 VG_ARB_MAGIC */
    uint32_t version;        /*  8 VG_ARB_VERSION */
    uint32_t size;           /* 12 VG_ARB_SIZE */
    uint64_t seq;            /* 16 odd while the plugin writes */
    uint64_t published_ns;   /* 24 CLOCK_REALTIME ns of the last publish */
    uint32_t period_ms;      /* 32 the plugin publishes at least this often */
    int32_t top_priority;    /* 36 the highest priority active on this GPU */
    uint32_t active;         /* 40 1: a container is active (top_priority is valid) */
    uint32_t floor_permille; /* 44 the SM rate lower priorities are held to */
    unsigned char pad[16];   /* 48 */
} vg_arbiter_record;

_Static_assert(sizeof(vg_arbiter_record) == VG_ARB_SIZE, "record size");
_Static_assert(offsetof(vg_arbiter_record, seq) == 16, "seq offset");
_Static_assert(offsetof(vg_arbiter_record, published_ns) == 24, "published offset");
_Static_assert(offsetof(vg_arbiter_record, top_priority) == 36, "top offset");
_Static_assert(offsetof(vg_arbiter_record, floor_permille) == 44, "floor offset");

#endif
