/* Internals shared by the files of the fake NVML. */
#ifndef FAKE_NVML_INT_H
#define FAKE_NVML_INT_H

#include <pthread.h>
#include <stddef.h>

#include "fake.h"
#include "nvmltypes.h"

/* A device handle: a GPU (physical device index; mig = 0) as one NVML session enumerated
 * it (serial: the session, nvml_device.c), or a MIG device (mig = 1: the compute instance
 * ci of GPU instance gi of device index; one static handle per (device, GPU instance id,
 * compute instance id), the same in every session). */
struct nvmlDevice_st {
    int index;
    int mig;
    int gi, ci;
    unsigned serial;
};
struct nvmlGpuInstance_st {
    int dev, id;
};
struct nvmlComputeInstance_st {
    int dev, gi, ci;
};

nvmlReturn_t fn_check_init(void);
/* Physical device of a GPU handle of the current session (not a MIG one), or -1. */
int fn_index(nvmlDevice_t d);
/* The current session's handle of physical device index; NULL when the session did not
 * enumerate it (it joined the bus after nvmlInit). */
nvmlDevice_t fn_handle(int index);
nvmlDevice_t fn_mig_handle(int dev, int gi, int ci);
nvmlGpuInstance_t fn_gi_handle(int dev, int gi);
nvmlComputeInstance_t fn_ci_handle(int dev, int gi, int ci);
/* 1 (and the ids) when h is one of the GPU / compute instance handles */
int fn_gi_of(nvmlGpuInstance_t h, int *dev, int *gi);
int fn_ci_of(nvmlComputeInstance_t h, int *dev, int *gi, int *ci);
/* 1 (and the ids) when d is a MIG device handle */
int fn_is_mig(nvmlDevice_t d, int *dev, int *gi, int *ci);

/* ---- the bus (nvml_bus.c): which devices are present, lost, which board generation they
 * are, from FAKECUDA_ABSENT and the lost/remove/add/replace lines of FAKECUDA_EVENTS (the
 * file is re-read whenever it changed) ---- */
struct fn_bus {
    int present[FC_MAX_DEV];
    int lost[FC_MAX_DEV];
    uint32_t gen[FC_MAX_DEV];   /* `replace` count: the board's UUID generation */
    uint32_t epoch[FC_MAX_DEV]; /* `remove` + `replace` count: instances of older ones are gone */
};
void fn_bus_get(struct fn_bus *b);
/* 1 when physical device dev is the board the current session enumerated (same remove /
 * replace epoch), still on the bus and not lost; 0: its handles answer GPU_IS_LOST. */
int fn_live(int dev, const struct fn_bus *bus);
/* A session starts (nvml_events.c): new event sets read the events file from its beginning
 * (first: the process's first session) or from its end as of now. */
void fn_events_begin(int first);
/* Frees every event set: the last nvmlShutdown ends the session. */
void fn_events_reset(void);
/* A full GPU handle whose device is on the bus and not lost: NVML_SUCCESS and *phys;
 * GPU_IS_LOST (lost or removed), NOT_SUPPORTED (a live MIG handle: the query is for GPUs),
 * INVALID_ARGUMENT (anything else). */
nvmlReturn_t fn_gpu(nvmlDevice_t d, int *phys, struct fn_bus *bus);
/* A live MIG device handle: NVML_SUCCESS and its ids; GPU_IS_LOST when its GPU is lost or
 * gone; INVALID_ARGUMENT (not a MIG handle, or its compute instance was destroyed). */
nvmlReturn_t fn_mig(nvmlDevice_t d, int *dev, int *gi, int *ci);
/* The MIG tables of dev, reset first when the board was replaced or re-attached (bus
 * generation/epoch differ from the tables'); under the state lock. */
struct fc_mig *fn_mig_locked(int dev, const struct fn_bus *bus);
/* The MIG index of a compute instance (its position in (GI id, CI id) order); under the lock. */
int fn_mig_index_locked(const struct fc_mig *m, int gi, int ci);
/* "NVIDIA Fake GPU 80GB MIG 1g.10gb" */
void fn_mig_name(int dev, const struct fc_gi *g, const struct fc_ci *ci, char *buf, size_t len);

#endif
