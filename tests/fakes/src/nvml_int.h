/* Internals shared by the files of the fake NVML. */
#ifndef FAKE_NVML_INT_H
#define FAKE_NVML_INT_H

#include <pthread.h>
#include <stddef.h>

#include "fake.h"
#include "nvmltypes.h"

struct nvmlDevice_st {
    int index;
};

nvmlReturn_t fn_check_init(void);
/* Index of a device handle, or -1. */
int fn_index(nvmlDevice_t d);
nvmlDevice_t fn_handle(int index);

#endif
