/*
 * Scriptable stand-in for libnvidia-ml.so.1, for tests only.
 *
 * It exports, under the exact symbol names that the pinned nvidia-ml-py binding looks up, the NVML
 * functions hma's gpu probe and NVML event source call, so that the real binding (its marshalling
 * and error mapping) runs unchanged over it. Built by tests/standin/build.py; never installed.
 *
 * The scenario is a text file named by $HMA_NVML_SCENARIO, read again at every nvmlInit, one
 * "key = value" per line ('#' starts a comment). Keys (I = device index, SYM = exported symbol):
 *   driver = 590.48.01                 nvmlSystemGetDriverVersion
 *   devices = 8                        nvmlDeviceGetCount_v2
 *   dev.I.name / uuid / bus_id / pci_device_id / arch
 *   dev.I.ecc_mode = CUR PEND          nvmlDeviceGetEccMode (absent: NOT_SUPPORTED)
 *   dev.I.ecc.E.C = N                  nvmlDeviceGetTotalEccErrors(errorType E, counterType C)
 *   dev.I.retired.CAUSE = N            nvmlDeviceGetRetiredPages (N pages)
 *   dev.I.retired_pending = 0|1        nvmlDeviceGetRetiredPagesPendingStatus
 *   dev.I.remap = CORR UNC PEND FAIL   nvmlDeviceGetRemappedRows
 *   dev.I.pcie = CURW MAXW CURG MAXG   PCIe width/generation calls
 *   dev.I.nvlinks = N                  links 0..N-1 exist (0/absent: NOT_SUPPORTED)
 *   dev.I.nvlink_state.L = 0|1         default 1 (active)
 *   dev.I.nvlink_err.L.C = N           nvmlDeviceGetNvLinkErrorCounter
 *   dev.I.clocks_event_reasons = X     hex or decimal
 *   dev.I.temp = T, dev.I.temp_threshold.K = T
 *   dev.I.fabric = STATE STATUS HEALTHMASK SUMMARY   (absent: NOT_SUPPORTED)
 *   dev.I.fabric_domain = CLUSTERUUID CLIQUE   clusterUuid (32 hex digits, dashes allowed) and
 *                                      cliqueId of the fabric calls (absent: zeros)
 *   dev.I.field.ID = V                 nvmlDeviceGetFieldValues (absent: per-field NOT_SUPPORTED)
 *   dev.I.event_types = X              nvmlDeviceGetSupportedEventTypes (default 0x8|0x2|0x1)
 *   err.SYM = CODE, err.SYM.I = CODE, err.*.I = CODE   make a call (on device I) return CODE
 *   hang.SYM = 1, hang.SYM.I = 1       make a call sleep forever
 *   events = /path/queue               Xid event queue: lines "I XID [EVENTTYPE]" appended by
 *                                      tests; an event set only sees lines added after it was made
 *   dev.I.processes = PID ...          (read by the stand-in nvidia-smi: a process holds the GPU,
 *   dev.I.reset = ok|fail               its --gpu-reset is refused; or the reset fails; a reset
 *                                      that succeeds removes the device's err.*.I lines)
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <stddef.h>
#include <libgen.h>
#include <poll.h>
#include <sys/inotify.h>

#define MAX_DEV 64
#define MAX_KV 8192

enum {
    OK = 0, UNINITIALIZED = 1, INVALID_ARGUMENT = 2, NOT_SUPPORTED = 3, NOT_FOUND = 6,
    INSUFFICIENT_SIZE = 7, DRIVER_NOT_LOADED = 9, TIMEOUT = 10, ARGUMENT_VERSION_MISMATCH = 25,
    UNKNOWN = 999
};

typedef struct hma_device { int index; } hma_device;
typedef hma_device *nvmlDevice_t;

typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

typedef union {
    double dVal;
    unsigned int uiVal;
    unsigned long ulVal;
    unsigned long long ullVal;
    long long sllVal;
    int siVal;
    unsigned short usVal;
} nvmlValue_t;

typedef struct {
    uint32_t fieldId, scopeId;
    int64_t timestamp, latencyUsec;
    unsigned int valueType, nvmlReturn;
    nvmlValue_t value;
} nvmlFieldValue_t;

typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType, eventData;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlEventData_t;

/* The deprecated v1 struct as nvml.h declares it (clusterUuid[NVML_GPU_FABRIC_UUID_LEN = 16]).
 * pynvml's c_nvmlGpuFabricInfo_t sizes it with NVML_DEVICE_UUID_BUFFER_SIZE (80) instead, so
 * the gpu probe passes its own struct (hma.probes.nvidia.gpu.FabricInfoV1) to that call. */
typedef struct {
    unsigned char clusterUuid[16];
    unsigned int status;
    uint32_t cliqueId;
    unsigned int state;
} nvmlGpuFabricInfo_t;

typedef struct {
    unsigned int version;
    unsigned char clusterUuid[16];
    unsigned int status;
    uint32_t cliqueId;
    unsigned int state;
    uint32_t healthMask;
} nvmlGpuFabricInfo_v2_t;

typedef struct {
    unsigned int version;
    unsigned char clusterUuid[16];
    unsigned int status;
    uint32_t cliqueId;
    unsigned int state;
    uint32_t healthMask;
    uint8_t healthSummary;
} nvmlGpuFabricInfo_v3_t;

#define FABRIC_V2 0x02000024u
#define FABRIC_V3 0x3000028u

typedef struct hma_event_set {
    long offset;
    unsigned long long mask[MAX_DEV];
} *nvmlEventSet_t;

static char *keys[MAX_KV], *vals[MAX_KV];
static int nkv;
static int initialized;
static hma_device devs[MAX_DEV];

static char *trim(char *s) {
    while (*s == ' ' || *s == '\t') s++;
    char *e = s + strlen(s);
    while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\n' || e[-1] == '\r')) *--e = 0;
    return s;
}

static void clear_kv(void) {
    for (int i = 0; i < nkv; i++) { free(keys[i]); free(vals[i]); }
    nkv = 0;
}

static int load_scenario(void) {
    const char *path = getenv("HMA_NVML_SCENARIO");
    if (!path) return 0;
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    clear_kv();
    char line[4096];
    while (fgets(line, sizeof line, f) && nkv < MAX_KV) {
        char *s = trim(line);
        if (!*s || *s == '#') continue;
        char *eq = strchr(s, '=');
        if (!eq) continue;
        *eq = 0;
        keys[nkv] = strdup(trim(s));
        vals[nkv] = strdup(trim(eq + 1));
        nkv++;
    }
    fclose(f);
    for (int i = 0; i < MAX_DEV; i++) devs[i].index = i;
    return 1;
}

static const char *get(const char *key) {
    for (int i = nkv - 1; i >= 0; i--)
        if (strcmp(keys[i], key) == 0) return vals[i];
    return NULL;
}

static const char *devget(int idx, const char *what) {
    char k[256];
    snprintf(k, sizeof k, "dev.%d.%s", idx, what);
    return get(k);
}

static unsigned long long num(const char *v) { return v ? strtoull(v, NULL, 0) : 0; }

static void hang_forever(void) {
    for (;;) sleep(3600);
}

/* Scripted error or hang for one call; idx < 0 for calls not about a device. */
static int gate(const char *sym, int idx) {
    char k[256];
    snprintf(k, sizeof k, "hang.%s", sym);
    if (get(k)) hang_forever();
    if (idx >= 0) {
        snprintf(k, sizeof k, "hang.%s.%d", sym, idx);
        if (get(k)) hang_forever();
        snprintf(k, sizeof k, "err.%s.%d", sym, idx);
        if (get(k)) return (int)num(get(k));
        snprintf(k, sizeof k, "err.*.%d", idx);
        if (get(k)) return (int)num(get(k));
    }
    snprintf(k, sizeof k, "err.%s", sym);
    if (get(k)) return (int)num(get(k));
    return OK;
}

static int device_count(void) {
    int n = (int)num(get("devices"));
    return n > MAX_DEV ? MAX_DEV : n;
}

static int dev_index(nvmlDevice_t d) {
    if (d < devs || d >= devs + MAX_DEV) return -1;
    return d->index;
}

#define ENTER(sym) \
    if (!initialized) return UNINITIALIZED; \
    { int _r = gate(sym, -1); if (_r) return _r; }

#define ENTER_DEV(sym, dev) \
    if (!initialized) return UNINITIALIZED; \
    int idx = dev_index(dev); \
    if (idx < 0 || idx >= device_count()) return INVALID_ARGUMENT; \
    { int _r = gate(sym, idx); if (_r) return _r; }

static void copy_str(char *dst, unsigned int len, const char *src) {
    if (!len) return;
    snprintf(dst, len, "%s", src ? src : "");
}

/* ---- init / system ---------------------------------------------------------------------- */

int nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    if (!load_scenario()) return DRIVER_NOT_LOADED;
    int r = gate("nvmlInitWithFlags", -1);
    if (r) return r;
    initialized++;
    return OK;
}

int nvmlInit_v2(void) { return nvmlInitWithFlags(0); }

int nvmlShutdown(void) {
    if (!initialized) return UNINITIALIZED;
    initialized--;
    return OK;
}

const char *nvmlErrorString(int result) {
    switch (result) {
    case OK: return "Success";
    case NOT_SUPPORTED: return "Not Supported";
    case TIMEOUT: return "Timeout";
    default: return "Stand-in error";
    }
}

int nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    ENTER("nvmlSystemGetDriverVersion");
    copy_str(version, length, get("driver") ? get("driver") : "590.48.01");
    return OK;
}

int nvmlDeviceGetCount_v2(unsigned int *count) {
    ENTER("nvmlDeviceGetCount_v2");
    *count = (unsigned int)device_count();
    return OK;
}

int nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    ENTER("nvmlDeviceGetHandleByIndex_v2");
    if ((int)index >= device_count()) return INVALID_ARGUMENT;
    int r = gate("nvmlDeviceGetHandleByIndex_v2", (int)index);
    if (r) return r;
    *device = &devs[index];
    return OK;
}

/* ---- identity --------------------------------------------------------------------------- */

int nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    ENTER_DEV("nvmlDeviceGetName", device);
    copy_str(name, length, devget(idx, "name") ? devget(idx, "name") : "NVIDIA Stand-in GPU");
    return OK;
}

int nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    ENTER_DEV("nvmlDeviceGetUUID", device);
    char def[64];
    snprintf(def, sizeof def, "GPU-00000000-0000-0000-0000-%012d", idx);
    copy_str(uuid, length, devget(idx, "uuid") ? devget(idx, "uuid") : def);
    return OK;
}

int nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    ENTER_DEV("nvmlDeviceGetPciInfo_v3", device);
    char def[32];
    snprintf(def, sizeof def, "00000000:%02X:00.0", 0x10 + idx);
    const char *bus_id = devget(idx, "bus_id") ? devget(idx, "bus_id") : def;
    memset(pci, 0, sizeof *pci);
    unsigned int dom = 0, bus = 0, dev = 0;
    sscanf(bus_id, "%x:%x:%x", &dom, &bus, &dev);
    pci->domain = dom;
    pci->bus = bus;
    pci->device = dev;
    pci->pciDeviceId = (unsigned int)num(devget(idx, "pci_device_id"));
    snprintf(pci->busId, sizeof pci->busId, "%s", bus_id);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.0", dom, bus, dev);
    return OK;
}

int nvmlDeviceGetArchitecture(nvmlDevice_t device, unsigned int *arch) {
    ENTER_DEV("nvmlDeviceGetArchitecture", device);
    const char *v = devget(idx, "arch");
    *arch = v ? (unsigned int)num(v) : 0xffffffffu;
    return OK;
}

/* ---- memory errors ---------------------------------------------------------------------- */

int nvmlDeviceGetEccMode(nvmlDevice_t device, unsigned int *current, unsigned int *pending) {
    ENTER_DEV("nvmlDeviceGetEccMode", device);
    const char *v = devget(idx, "ecc_mode");
    if (!v) return NOT_SUPPORTED;
    unsigned int c = 0, p = 0;
    if (sscanf(v, "%u %u", &c, &p) < 2) p = c;
    *current = c;
    *pending = p;
    return OK;
}

int nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, unsigned int errorType,
                                unsigned int counterType, unsigned long long *count) {
    ENTER_DEV("nvmlDeviceGetTotalEccErrors", device);
    if (!devget(idx, "ecc_mode")) return NOT_SUPPORTED;
    char k[64];
    snprintf(k, sizeof k, "ecc.%u.%u", errorType, counterType);
    *count = num(devget(idx, k));
    return OK;
}

int nvmlDeviceGetRetiredPages(nvmlDevice_t device, unsigned int cause, unsigned int *pageCount,
                              unsigned long long *addresses) {
    ENTER_DEV("nvmlDeviceGetRetiredPages", device);
    if (!devget(idx, "retired_pending")) return NOT_SUPPORTED;
    char k[64];
    snprintf(k, sizeof k, "retired.%u", cause);
    unsigned int n = (unsigned int)num(devget(idx, k));
    if (!addresses || *pageCount < n) {
        *pageCount = n;
        return n ? INSUFFICIENT_SIZE : OK;
    }
    for (unsigned int i = 0; i < n; i++) addresses[i] = 0x1000ull * (i + 1) + cause;
    *pageCount = n;
    return OK;
}

int nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t device, unsigned int *isPending) {
    ENTER_DEV("nvmlDeviceGetRetiredPagesPendingStatus", device);
    const char *v = devget(idx, "retired_pending");
    if (!v) return NOT_SUPPORTED;
    *isPending = (unsigned int)num(v);
    return OK;
}

int nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corrRows, unsigned int *uncRows,
                              unsigned int *isPending, unsigned int *failureOccurred) {
    ENTER_DEV("nvmlDeviceGetRemappedRows", device);
    const char *v = devget(idx, "remap");
    if (!v) return NOT_SUPPORTED;
    unsigned int a = 0, b = 0, c = 0, d = 0;
    sscanf(v, "%u %u %u %u", &a, &b, &c, &d);
    *corrRows = a;
    *uncRows = b;
    *isPending = c;
    *failureOccurred = d;
    return OK;
}

/* ---- PCIe ------------------------------------------------------------------------------- */

static int pcie_part(int idx, int part, unsigned int *out) {
    const char *v = devget(idx, "pcie");
    if (!v) return NOT_SUPPORTED;
    unsigned int p[4] = {0, 0, 0, 0};
    sscanf(v, "%u %u %u %u", &p[0], &p[1], &p[2], &p[3]);
    *out = p[part];
    return OK;
}

int nvmlDeviceGetCurrPcieLinkWidth(nvmlDevice_t device, unsigned int *w) {
    ENTER_DEV("nvmlDeviceGetCurrPcieLinkWidth", device);
    return pcie_part(idx, 0, w);
}

int nvmlDeviceGetMaxPcieLinkWidth(nvmlDevice_t device, unsigned int *w) {
    ENTER_DEV("nvmlDeviceGetMaxPcieLinkWidth", device);
    return pcie_part(idx, 1, w);
}

int nvmlDeviceGetCurrPcieLinkGeneration(nvmlDevice_t device, unsigned int *g) {
    ENTER_DEV("nvmlDeviceGetCurrPcieLinkGeneration", device);
    return pcie_part(idx, 2, g);
}

int nvmlDeviceGetMaxPcieLinkGeneration(nvmlDevice_t device, unsigned int *g) {
    ENTER_DEV("nvmlDeviceGetMaxPcieLinkGeneration", device);
    return pcie_part(idx, 3, g);
}

/* ---- NVLink ----------------------------------------------------------------------------- */

static int link_ok(int idx, unsigned int link) {
    unsigned int n = (unsigned int)num(devget(idx, "nvlinks"));
    if (!n) return NOT_SUPPORTED;
    return link < n ? OK : INVALID_ARGUMENT;
}

int nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link, unsigned int *isActive) {
    ENTER_DEV("nvmlDeviceGetNvLinkState", device);
    int r = link_ok(idx, link);
    if (r) return r;
    char k[64];
    snprintf(k, sizeof k, "nvlink_state.%u", link);
    const char *v = devget(idx, k);
    *isActive = v ? (unsigned int)num(v) : 1u;
    return OK;
}

int nvmlDeviceGetNvLinkErrorCounter(nvmlDevice_t device, unsigned int link, unsigned int counter,
                                    unsigned long long *value) {
    ENTER_DEV("nvmlDeviceGetNvLinkErrorCounter", device);
    int r = link_ok(idx, link);
    if (r) return r;
    char k[64];
    snprintf(k, sizeof k, "nvlink_err.%u.%u", link, counter);
    *value = num(devget(idx, k));
    return OK;
}

/* ---- clocks, thermal -------------------------------------------------------------------- */

int nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device, unsigned long long *reasons) {
    ENTER_DEV("nvmlDeviceGetCurrentClocksEventReasons", device);
    const char *v = devget(idx, "clocks_event_reasons");
    *reasons = v ? num(v) : 0x1ull;
    return OK;
}

int nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device, unsigned long long *reasons) {
    return nvmlDeviceGetCurrentClocksEventReasons(device, reasons);
}

int nvmlDeviceGetTemperature(nvmlDevice_t device, unsigned int sensor, unsigned int *temp) {
    ENTER_DEV("nvmlDeviceGetTemperature", device);
    if (sensor != 0) return INVALID_ARGUMENT;
    const char *v = devget(idx, "temp");
    if (!v) return NOT_SUPPORTED;
    *temp = (unsigned int)num(v);
    return OK;
}

int nvmlDeviceGetTemperatureThreshold(nvmlDevice_t device, unsigned int which,
                                      unsigned int *temp) {
    ENTER_DEV("nvmlDeviceGetTemperatureThreshold", device);
    char k[64];
    snprintf(k, sizeof k, "temp_threshold.%u", which);
    const char *v = devget(idx, k);
    if (!v) return NOT_SUPPORTED;
    *temp = (unsigned int)num(v);
    return OK;
}

/* ---- fabric ----------------------------------------------------------------------------- */

static int fabric_parts(int idx, unsigned int p[4]) {
    const char *v = devget(idx, "fabric");
    if (!v) return NOT_SUPPORTED;
    p[0] = p[1] = p[2] = p[3] = 0;
    sscanf(v, "%u %u %i %u", &p[0], &p[1], (int *)&p[2], &p[3]);
    return OK;
}

/* dev.I.fabric_domain: the NVLink domain (cluster UUID bytes and clique id) the GPU reports. */
static void fabric_domain(int idx, unsigned char uuid[16], uint32_t *clique) {
    const char *v = devget(idx, "fabric_domain");
    memset(uuid, 0, 16);
    *clique = 0;
    if (!v) return;
    int n = 0;
    const char *c = v;
    for (; *c && *c != ' ' && n < 32; c++) {
        if (*c == '-') continue;
        unsigned int d;
        if (sscanf(c, "%1x", &d) != 1) break;
        uuid[n / 2] = (unsigned char)(n % 2 ? uuid[n / 2] | d : d << 4);
        n++;
    }
    while (*c && *c != ' ') c++;
    *clique = (uint32_t)num(c);
}

int nvmlDeviceGetGpuFabricInfo(nvmlDevice_t device, nvmlGpuFabricInfo_t *info) {
    ENTER_DEV("nvmlDeviceGetGpuFabricInfo", device);
    unsigned int p[4];
    int r = fabric_parts(idx, p);
    if (r) return r;
    memset(info, 0, sizeof *info);
    info->state = p[0];
    info->status = p[1];
    fabric_domain(idx, info->clusterUuid, &info->cliqueId);
    return OK;
}

int nvmlDeviceGetGpuFabricInfoV(nvmlDevice_t device, void *raw) {
    ENTER_DEV("nvmlDeviceGetGpuFabricInfoV", device);
    unsigned int version = *(unsigned int *)raw;
    if (version != FABRIC_V2 && version != FABRIC_V3) return ARGUMENT_VERSION_MISMATCH;
    unsigned int p[4];
    int r = fabric_parts(idx, p);
    if (r) return r;
    if (version == FABRIC_V3) {
        nvmlGpuFabricInfo_v3_t *info = raw;
        memset(info, 0, sizeof *info);
        info->version = version;
        info->state = p[0];
        info->status = p[1];
        info->healthMask = p[2];
        info->healthSummary = (uint8_t)p[3];
        fabric_domain(idx, info->clusterUuid, &info->cliqueId);
    } else {
        nvmlGpuFabricInfo_v2_t *info = raw;
        memset(info, 0, sizeof *info);
        info->version = version;
        info->state = p[0];
        info->status = p[1];
        info->healthMask = p[2];
        fabric_domain(idx, info->clusterUuid, &info->cliqueId);
    }
    return OK;
}

/* ---- field values ----------------------------------------------------------------------- */

int nvmlDeviceGetFieldValues(nvmlDevice_t device, int valuesCount, nvmlFieldValue_t *values) {
    ENTER_DEV("nvmlDeviceGetFieldValues", device);
    for (int i = 0; i < valuesCount; i++) {
        char k[64];
        snprintf(k, sizeof k, "field.%u", values[i].fieldId);
        const char *v = devget(idx, k);
        values[i].timestamp = (int64_t)time(NULL) * 1000000;
        values[i].latencyUsec = 0;
        if (!v) {
            values[i].nvmlReturn = NOT_SUPPORTED;
            continue;
        }
        values[i].nvmlReturn = OK;
        values[i].valueType = 1; /* NVML_VALUE_TYPE_UNSIGNED_INT */
        values[i].value.ullVal = 0;
        values[i].value.uiVal = (unsigned int)num(v);
    }
    return OK;
}

/* ---- events ----------------------------------------------------------------------------- */

int nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *types) {
    ENTER_DEV("nvmlDeviceGetSupportedEventTypes", device);
    const char *v = devget(idx, "event_types");
    *types = v ? num(v) : 0xbull;
    return OK;
}

static long file_size(const char *path) {
    FILE *f = path ? fopen(path, "r") : NULL;
    if (!f) return 0;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fclose(f);
    return n;
}

int nvmlEventSetCreate(nvmlEventSet_t *set) {
    ENTER("nvmlEventSetCreate");
    nvmlEventSet_t s = calloc(1, sizeof *s);
    if (!s) return UNKNOWN;
    s->offset = file_size(get("events"));
    *set = s;
    return OK;
}

int nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long types, nvmlEventSet_t set) {
    ENTER_DEV("nvmlDeviceRegisterEvents", device);
    if (!set) return INVALID_ARGUMENT;
    unsigned long long supported = 0;
    nvmlDeviceGetSupportedEventTypes(device, &supported);
    if (types & ~supported) return NOT_SUPPORTED;
    set->mask[idx] |= types;
    return OK;
}

/* Next complete queue line after set->offset; 1 when one was consumed into the out params. */
static int next_event(nvmlEventSet_t set, int *dev, unsigned long long *data,
                      unsigned long long *type) {
    const char *path = get("events");
    FILE *f = path ? fopen(path, "r") : NULL;
    if (!f) return 0;
    int found = 0;
    char line[512];
    while (!found && fseek(f, set->offset, SEEK_SET) == 0 && fgets(line, sizeof line, f)) {
        size_t n = strlen(line);
        if (n == 0 || line[n - 1] != '\n') break; /* incomplete line: wait for the rest */
        set->offset += (long)n;
        int d = -1;
        unsigned long long x = 0, t = 0x8;
        if (sscanf(line, "%d %llu %lli", &d, &x, (long long *)&t) < 2) continue;
        if (d < 0 || d >= MAX_DEV || d >= device_count() || !(set->mask[d] & t)) continue;
        *dev = d;
        *data = x;
        *type = t;
        found = 1;
    }
    fclose(f);
    return found;
}

/* Blocks on inotify (the events file's folder) until a line may have been added or the timeout
   passes, as the driver blocks in the kernel; no polling, so CPU figures are the agent's. */
static int watch_events(void) {
    const char *path = get("events");
    if (!path) return -1;
    int fd = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
    if (fd < 0) return -1;
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    if (inotify_add_watch(fd, dirname(dir), IN_MODIFY | IN_CREATE | IN_MOVED_TO) < 0) {
        close(fd);
        return -1;
    }
    return fd;
}

int nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
    ENTER("nvmlEventSetWait_v2");
    if (!set) return INVALID_ARGUMENT;
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    int fd = watch_events(); /* before the first look: no line can slip in between */
    for (;;) {
        int d;
        unsigned long long x, t;
        if (next_event(set, &d, &x, &t)) {
            if (fd >= 0) close(fd);
            memset(data, 0, sizeof *data);
            data->device = &devs[d];
            data->eventType = t;
            data->eventData = x;
            data->gpuInstanceId = 0xffffffffu;
            data->computeInstanceId = 0xffffffffu;
            return OK;
        }
        clock_gettime(CLOCK_MONOTONIC, &now);
        long ms = (now.tv_sec - start.tv_sec) * 1000 + (now.tv_nsec - start.tv_nsec) / 1000000;
        long left = (long)timeoutms - ms;
        if (left <= 0) {
            if (fd >= 0) close(fd);
            return TIMEOUT;
        }
        if (fd >= 0) {
            struct pollfd pfd = {fd, POLLIN, 0};
            char buf[4096];
            if (poll(&pfd, 1, (int)left) > 0)
                while (read(fd, buf, sizeof buf) > 0) {
                }
        } else { /* no events file configured, or no inotify: sleep out the timeout */
            struct timespec nap = {left / 1000, (left % 1000) * 1000000L};
            nanosleep(&nap, NULL);
        }
    }
}

int nvmlEventSetFree(nvmlEventSet_t set) {
    if (!initialized) return UNINITIALIZED;
    free(set);
    return OK;
}

/* ---- layout, for the struct test -------------------------------------------------------- */

#define LAYOUT(name, value) if (strcmp(what, name) == 0) return (long)(value)

long hmastub_layout(const char *what) {
    LAYOUT("nvmlPciInfo_t", sizeof(nvmlPciInfo_t));
    LAYOUT("nvmlPciInfo_t.domain", offsetof(nvmlPciInfo_t, domain));
    LAYOUT("nvmlPciInfo_t.bus", offsetof(nvmlPciInfo_t, bus));
    LAYOUT("nvmlPciInfo_t.device", offsetof(nvmlPciInfo_t, device));
    LAYOUT("nvmlPciInfo_t.pciDeviceId", offsetof(nvmlPciInfo_t, pciDeviceId));
    LAYOUT("nvmlPciInfo_t.pciSubSystemId", offsetof(nvmlPciInfo_t, pciSubSystemId));
    LAYOUT("nvmlPciInfo_t.busId", offsetof(nvmlPciInfo_t, busId));
    LAYOUT("nvmlFieldValue_t", sizeof(nvmlFieldValue_t));
    LAYOUT("nvmlFieldValue_t.scopeId", offsetof(nvmlFieldValue_t, scopeId));
    LAYOUT("nvmlFieldValue_t.timestamp", offsetof(nvmlFieldValue_t, timestamp));
    LAYOUT("nvmlFieldValue_t.latencyUsec", offsetof(nvmlFieldValue_t, latencyUsec));
    LAYOUT("nvmlFieldValue_t.valueType", offsetof(nvmlFieldValue_t, valueType));
    LAYOUT("nvmlFieldValue_t.nvmlReturn", offsetof(nvmlFieldValue_t, nvmlReturn));
    LAYOUT("nvmlFieldValue_t.value", offsetof(nvmlFieldValue_t, value));
    LAYOUT("nvmlValue_t", sizeof(nvmlValue_t));
    LAYOUT("nvmlEventData_t", sizeof(nvmlEventData_t));
    LAYOUT("nvmlEventData_t.eventType", offsetof(nvmlEventData_t, eventType));
    LAYOUT("nvmlEventData_t.eventData", offsetof(nvmlEventData_t, eventData));
    LAYOUT("nvmlEventData_t.gpuInstanceId", offsetof(nvmlEventData_t, gpuInstanceId));
    LAYOUT("nvmlEventData_t.computeInstanceId", offsetof(nvmlEventData_t, computeInstanceId));
    LAYOUT("nvmlGpuFabricInfo_t", sizeof(nvmlGpuFabricInfo_t));
    LAYOUT("nvmlGpuFabricInfo_t.status", offsetof(nvmlGpuFabricInfo_t, status));
    LAYOUT("nvmlGpuFabricInfo_t.cliqueId", offsetof(nvmlGpuFabricInfo_t, cliqueId));
    LAYOUT("nvmlGpuFabricInfo_t.state", offsetof(nvmlGpuFabricInfo_t, state));
    LAYOUT("nvmlGpuFabricInfo_v2_t", sizeof(nvmlGpuFabricInfo_v2_t));
    LAYOUT("nvmlGpuFabricInfo_v2_t.clusterUuid", offsetof(nvmlGpuFabricInfo_v2_t, clusterUuid));
    LAYOUT("nvmlGpuFabricInfo_v2_t.status", offsetof(nvmlGpuFabricInfo_v2_t, status));
    LAYOUT("nvmlGpuFabricInfo_v2_t.state", offsetof(nvmlGpuFabricInfo_v2_t, state));
    LAYOUT("nvmlGpuFabricInfo_v2_t.healthMask", offsetof(nvmlGpuFabricInfo_v2_t, healthMask));
    LAYOUT("nvmlGpuFabricInfo_v3_t", sizeof(nvmlGpuFabricInfo_v3_t));
    LAYOUT("nvmlGpuFabricInfo_v3_t.healthMask", offsetof(nvmlGpuFabricInfo_v3_t, healthMask));
    LAYOUT("nvmlGpuFabricInfo_v3_t.healthSummary",
           offsetof(nvmlGpuFabricInfo_v3_t, healthSummary));
    return -1;
}
