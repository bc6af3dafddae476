/* The fast-set NVML calls answered in C, instantly, with an idle H200's values: put under
 * vgpumon.testing.fake_nvml.FakeLib by bench/fake_fastset.py so that a machine without a GPU
 * measures the Python side of a sample with real ctypes calls (a Python stand-in's own cost
 * would otherwise dwarf it). Layouts from nvml.h; never a figure for the docs' claims. */
#include <stdint.h>
#include <string.h>

typedef struct { unsigned version; unsigned long long total, reserved, free, used; } mem_v2;
typedef struct { unsigned gpu, memory; } util;
typedef struct { unsigned pid; unsigned long long usedGpuMemory; unsigned gpuInstanceId, computeInstanceId; } proc_v3;
typedef struct {
    unsigned fieldId, scopeId; long long timestamp, latencyUsec; int valueType, nvmlReturn;
    union { double d; unsigned ui; unsigned long ul; unsigned long long ull; long long sll; int si; unsigned short us; } value;
} field_value;
typedef struct { const char *shortName, *longName, *unit; } metric_info;
typedef struct { unsigned metricId; int nvmlReturn; double value; metric_info info; } gpm_metric;
typedef struct { unsigned version, numMetrics; void *sample1, *sample2; gpm_metric metrics[210]; } gpm_get;

int nvmlDeviceGetMemoryInfo_v2(void *h, mem_v2 *m) {
    m->total = 150754820096ULL; m->reserved = 644939776ULL; m->free = 150109880320ULL; m->used = 0; return 0;
}
int nvmlDeviceGetUtilizationRates(void *h, util *u) { u->gpu = 0; u->memory = 0; return 0; }
int nvmlDeviceGetTemperature(void *h, int sensor, unsigned *t) { *t = 34; return 0; }
int nvmlDeviceGetPowerUsage(void *h, unsigned *p) { *p = 80812; return 0; }
int nvmlDeviceGetClockInfo(void *h, int clock, unsigned *c) { *c = 345; return 0; }
int nvmlDeviceGetCurrentClocksEventReasons(void *h, unsigned long long *r) { *r = 1; return 0; }
int nvmlDeviceGetPerformanceState(void *h, unsigned *p) { *p = 0; return 0; }
int nvmlDeviceGetCurrPcieLinkGeneration(void *h, unsigned *g) { *g = 5; return 0; }
int nvmlDeviceGetCurrPcieLinkWidth(void *h, unsigned *w) { *w = 16; return 0; }
int nvmlDeviceGetComputeRunningProcesses_v3(void *h, unsigned *count, proc_v3 *p) { *count = 0; return 0; }
int nvmlDeviceGetFieldValues(void *h, int n, field_value *v) {
    for (int i = 0; i < n; i++) { v[i].valueType = 1; v[i].nvmlReturn = 0; v[i].value.ui = 38; }
    return 0;
}
int nvmlGpmSampleGet(void *h, void *sample) { return 0; }
int nvmlGpmMetricsGet(gpm_get *g) {
    for (unsigned i = 0; i < g->numMetrics; i++) { g->metrics[i].nvmlReturn = 0; g->metrics[i].value = 0.0; }
    return 0;
}
