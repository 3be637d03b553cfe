/* A stand-in for libnvidia-ml.so.1 with the ABI of the calls shares/reserve_gpu.py makes, reporting
 * the GPU the build defines (the tests build it from ../shared/fixtures/gpu/h200/nvml.json). FAKE_NVML_COUNT
 * sets how many GPUs it shows (1 by default; GPU i's UUID ends in i past the first), FAKE_NVML_INIT sets
 * what nvmlInit_v2 returns. Every string call honours the caller's buffer size, as NVML does
 * (NVML_ERROR_INSUFFICIENT_SIZE, 7, when it is too small). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
static int initialised = 0;

static int copy(char *buffer, unsigned int size, const char *text) {
    if (strlen(text) + 1 > size) return 7;
    strcpy(buffer, text);
    return 0;
}

static unsigned int count(void) {
    const char *value = getenv("FAKE_NVML_COUNT");
    return value ? (unsigned int)atoi(value) : 1;
}

int nvmlInit_v2(void) {
    const char *value = getenv("FAKE_NVML_INIT");
    int code = value ? atoi(value) : 0;
    initialised = code == 0;
    return code;
}
int nvmlShutdown(void) { initialised = 0; return 0; }
const char *nvmlErrorString(int code) { return code == 9 ? "Driver Not Loaded" : "Unknown Error"; }

int nvmlDeviceGetCount_v2(unsigned int *out) {
    if (!initialised) return 1;
    *out = count();
    return 0;
}
int nvmlDeviceGetHandleByIndex_v2(unsigned int index, void **handle) {
    if (!initialised) return 1;
    if (index >= count()) return 2;
    *handle = (void *)(unsigned long)(index + 1);
    return 0;
}
int nvmlDeviceGetUUID(void *handle, char *buffer, unsigned int size) {
    char uuid[96];
    unsigned long index = (unsigned long)handle - 1;
    if (index == 0) snprintf(uuid, sizeof uuid, "%s", FAKE_UUID);
    else snprintf(uuid, sizeof uuid, "%.*s%lu", (int)strlen(FAKE_UUID) - 1, FAKE_UUID, index);
    return copy(buffer, size, uuid);
}
int nvmlDeviceGetName(void *handle, char *buffer, unsigned int size) { (void)handle; return copy(buffer, size, FAKE_NAME); }
int nvmlDeviceGetMemoryInfo(void *handle, nvmlMemory_t *memory) {
    (void)handle;
    memory->total = FAKE_MEMORY;
    memory->used = 0;
    memory->free = FAKE_MEMORY;
    return 0;
}
int nvmlSystemGetDriverVersion(char *buffer, unsigned int size) { return copy(buffer, size, FAKE_DRIVER); }
