#ifndef PROGS_RESOLVE_H
#define PROGS_RESOLVE_H

#include "api.h"

#define PROGS_CUDA_VERSION 12080 /* what libcudart 12.8 asks for */

int api_resolve_dlsym(struct api *a);
int api_resolve_proc(struct api *a, int version, cuuint64_t flags);
int api_take_ptds_flag(int *argc, char **argv);

#endif
