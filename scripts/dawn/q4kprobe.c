// q4kprobe: times a Q4_K matrix-vector kernel (q4k_dp4a.wgsl) and a copy
// kernel moving as many bytes, each dispatch after the one before, on
// Dawn through webgpu.h, and checks the product against the CPU. A probe
// for what packed 8-bit dot products and subgroups (which wgpu-native
// v22's WGSL lacks) would give the decode step's products. See README.md.
//
//   q4kprobe KERNEL.wgsl ROWS COLS [ROWS_A_THREAD SPR WG [REPS]]
//   q4kprobe -ours PREFIX ROWS COLS [REPS]
//
// -ours runs the op library's own q4k_matmul_xq instead (PREFIX.wgsl and
// PREFIX.launch from scripts/dawn/dump, for the same shape) on the same
// weights and x in its own quantized form: what Dawn's compiler makes of
// the kernel that wgpu-native runs today.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "webgpu.h"

// Dawn's enum values where the header this builds against differs.
#define FEATURE_SUBGROUPS ((WGPUFeatureName)17)

static WGPUInstance inst;
static WGPUComputePipeline copyPipe;
static WGPUAdapter adapter;
static WGPUDevice device;
static volatile int done;

static void onAdapter(WGPURequestAdapterStatus s, WGPUAdapter a, WGPUStringView m, void *u1, void *u2) {
  if (s != WGPURequestAdapterStatus_Success) fprintf(stderr, "adapter: %.*s\n", (int)m.length, m.data);
  adapter = a;
  done = 1;
}

// Dawn's toggles (DawnTogglesDescriptor, sType 0x5000A in this build: the
// header used here lacks it): DAWN_ENABLE and DAWN_DISABLE, comma-separated
// names (disable_robustness, disable_workgroup_init, ...), chained to the
// instance's descriptor and the device's. The descriptors are zeroed
// blocks larger than either struct, so that a field this header lacks
// reads as zero.
typedef struct {
  WGPUChainedStruct chain;
  size_t enabledCount;
  const char *const *enabled;
  size_t disabledCount;
  const char *const *disabled;
} DawnToggles;

static size_t splitList(const char *env, const char **out, size_t max) {
  const char *v = getenv(env);
  size_t n = 0;
  if (!v || !*v) return 0;
  char *dup = strdup(v);
  for (char *t = strtok(dup, ","); t && n < max; t = strtok(NULL, ",")) out[n++] = t;
  return n;
}

static DawnToggles *toggles(void) {
  static const char *en[16], *dis[16];
  static DawnToggles t;
  t.chain.sType = (WGPUSType)0x5000A;
  t.enabledCount = splitList("DAWN_ENABLE", en, 16);
  t.enabled = en;
  t.disabledCount = splitList("DAWN_DISABLE", dis, 16);
  t.disabled = dis;
  if (t.enabledCount + t.disabledCount == 0) return NULL;
  for (size_t i = 0; i < t.enabledCount; i++) printf("toggle on: %s\n", en[i]);
  for (size_t i = 0; i < t.disabledCount; i++) printf("toggle off: %s\n", dis[i]);
  return &t;
}

static void onDevice(WGPURequestDeviceStatus s, WGPUDevice d, WGPUStringView m, void *u1, void *u2) {
  if (s != WGPURequestDeviceStatus_Success) fprintf(stderr, "device: %.*s\n", (int)m.length, m.data);
  device = d;
  done = 1;
}
static void onError(WGPUDevice const *d, WGPUErrorType t, WGPUStringView m, void *u1, void *u2) {
  fprintf(stderr, "device error %d: %.*s\n", t, (int)m.length, m.data);
  exit(2);
}
static void onDone(WGPUQueueWorkDoneStatus s, WGPUStringView m, void *u1, void *u2) { done = 1; }
static void onMap(WGPUMapAsyncStatus s, WGPUStringView m, void *u1, void *u2) { done = 1; }

static void wait(void) {
  while (!done) wgpuInstanceProcessEvents(inst);
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

static WGPUBuffer buffer(uint64_t size, WGPUBufferUsage usage) {
  WGPUBufferDescriptor d = {0};
  d.size = size;
  d.usage = usage;
  return wgpuDeviceCreateBuffer(device, &d);
}

static char *readFile(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) { perror(path); exit(1); }
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *s = malloc(n + 1);
  if (fread(s, 1, n, f) != (size_t)n) { perror(path); exit(1); }
  s[n] = 0;
  fclose(f);
  return s;
}

// setConst replaces the value of "const NAME: u32 = ...;" in src.
static char *setConst(char *src, const char *name, unsigned v) {
  char key[64];
  snprintf(key, sizeof key, "const %s: u32 = ", name);
  char *at = strstr(src, key);
  if (!at) { fprintf(stderr, "no %s in the kernel\n", key); exit(1); }
  char *end = strchr(at, ';');
  char val[32];
  snprintf(val, sizeof val, "%uu", v);
  size_t head = at - src + strlen(key);
  char *out = malloc(strlen(src) + 32);
  memcpy(out, src, head);
  strcpy(out + head, val);
  strcat(out, end);
  return out;
}

static WGPUComputePipeline pipeline(const char *src) {
  WGPUShaderSourceWGSL w = {0};
  w.chain.sType = WGPUSType_ShaderSourceWGSL;
  w.code.data = src;
  w.code.length = strlen(src);
  WGPUShaderModuleDescriptor sd = {0};
  sd.nextInChain = &w.chain;
  WGPUComputePipelineDescriptor pd = {0};
  pd.compute.module = wgpuDeviceCreateShaderModule(device, &sd);
  pd.compute.entryPoint.data = "main";
  pd.compute.entryPoint.length = 4;
  return wgpuDeviceCreateComputePipeline(device, &pd);
}

static WGPUBindGroup bindAt(WGPUComputePipeline p, uint32_t group, int n, WGPUBuffer *bufs, uint64_t *sizes) {
  WGPUBindGroupEntry e[8] = {{0}};
  for (int i = 0; i < n; i++) {
    e[i].binding = i;
    e[i].buffer = bufs[i];
    e[i].size = sizes[i];
  }
  WGPUBindGroupDescriptor d = {0};
  d.layout = wgpuComputePipelineGetBindGroupLayout(p, group);
  d.entryCount = n;
  d.entries = e;
  return wgpuDeviceCreateBindGroup(device, &d);
}

static WGPUBindGroup bind(WGPUComputePipeline p, int n, WGPUBuffer *bufs, uint64_t *sizes) {
  return bindAt(p, 0, n, bufs, sizes);
}

static WGPUBindGroup group1; // -ours: the params' group, else NULL

// run records reps dispatches (bind group i % nbg), submits them and
// waits; it returns the seconds they took.
static double run(WGPUComputePipeline p, WGPUBindGroup *bgs, int nbg, uint32_t gx, uint32_t gy, int reps) {
  WGPUCommandEncoder enc = wgpuDeviceCreateCommandEncoder(device, NULL);
  WGPUComputePassEncoder pass = wgpuCommandEncoderBeginComputePass(enc, NULL);
  wgpuComputePassEncoderSetPipeline(pass, p);
  if (group1 && p != copyPipe) wgpuComputePassEncoderSetBindGroup(pass, 1, group1, 0, NULL);
  for (int i = 0; i < reps; i++) {
    wgpuComputePassEncoderSetBindGroup(pass, 0, bgs[i % nbg], 0, NULL);
    wgpuComputePassEncoderDispatchWorkgroups(pass, gx, gy, 1);
  }
  wgpuComputePassEncoderEnd(pass);
  WGPUCommandBuffer cb = wgpuCommandEncoderFinish(enc, NULL);
  WGPUQueue q = wgpuDeviceGetQueue(device);
  double t = now();
  wgpuQueueSubmit(q, 1, &cb);
  WGPUQueueWorkDoneCallbackInfo ci = {0};
  ci.mode = WGPUCallbackMode_AllowProcessEvents;
  ci.callback = onDone;
  done = 0;
  wgpuQueueOnSubmittedWorkDone(q, ci);
  wait();
  return now() - t;
}

static float half2float(uint16_t h) {
  uint32_t s = (h >> 15) & 1, e = (h >> 10) & 31, m = h & 1023;
  float v = e == 0 ? ldexpf((float)m, -24) : ldexpf((float)(m | 1024), (int)e - 25);
  return s ? -v : v;
}

// scaleMin is get_scale_min_k4: sub-block j's 6-bit scale and min.
static void scaleMin(const uint8_t *q, int j, int *sc, int *m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 15) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

static int cmpd(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int main(int argc, char **argv) {
  int ours = argc > 1 && strcmp(argv[1], "-ours") == 0;
  if (ours) {
    argv++;
    argc--;
  }
  if (argc < 4) {
    fprintf(stderr, "usage: q4kprobe KERNEL.wgsl ROWS COLS [ROWS_A_THREAD SPR WG [REPS]]\n       q4kprobe -ours PREFIX ROWS COLS [REPS]\n");
    return 1;
  }
  unsigned rows = atoi(argv[2]), cols = atoi(argv[3]);
  unsigned rt = 4, spr = 2, wg = 128;
  int reps = 200;
  if (ours) {
    if (argc > 4) reps = atoi(argv[4]);
  } else {
    if (argc > 4) rt = atoi(argv[4]);
    if (argc > 5) spr = atoi(argv[5]);
    if (argc > 6) wg = atoi(argv[6]);
    if (argc > 7) reps = atoi(argv[7]);
  }
  if (cols % 256 || rows == 0 || rt == 0 || rt > 16 || spr == 0 || spr > 4 || (wg != 64 && wg != 128 && wg != 256)) {
    fprintf(stderr, "bad shape or layout\n");
    return 1;
  }
  DawnToggles *tg = toggles();
  static uint64_t idesc[32]; // a zeroed WGPUInstanceDescriptor, larger than Dawn's
  ((WGPUInstanceDescriptor *)idesc)->nextInChain = tg ? &tg->chain : NULL;
  inst = wgpuCreateInstance((WGPUInstanceDescriptor *)idesc);
  WGPURequestAdapterOptions ao = {0};
  ao.powerPreference = WGPUPowerPreference_HighPerformance;
  WGPURequestAdapterCallbackInfo ac = {0};
  ac.mode = WGPUCallbackMode_AllowProcessEvents;
  ac.callback = onAdapter;
  wgpuInstanceRequestAdapter(inst, &ao, ac);
  wait();
  if (!adapter) return 1;
  WGPUAdapterInfo info = {0};
  wgpuAdapterGetInfo(adapter, &info);
  printf("adapter %.*s (%.*s), backend %d, subgroups %u-%u\n", (int)info.device.length, info.device.data,
         (int)info.description.length, info.description.data, info.backendType, info.subgroupMinSize, info.subgroupMaxSize);
  WGPUFeatureName feats[1] = {FEATURE_SUBGROUPS};
  // The default limits hold Mixtral's matrices (128 MiB a storage
  // binding); the adapter's own are not asked for, since WGPULimits'
  // layout may differ between this header and the Dawn build.
  WGPUDeviceDescriptor dd = {0};
  dd.requiredFeatureCount = 1;
  dd.requiredFeatures = feats;
  dd.uncapturedErrorCallbackInfo.callback = onError;
  dd.nextInChain = tg ? &tg->chain : NULL;
  WGPURequestDeviceCallbackInfo dc = {0};
  dc.mode = WGPUCallbackMode_AllowProcessEvents;
  dc.callback = onDevice;
  done = 0;
  wgpuAdapterRequestDevice(adapter, &dd, dc);
  wait();
  if (!device) return 1;
  WGPUQueue queue = wgpuDeviceGetQueue(device);

  // Weights: copies enough to rotate over 256 MiB (beyond the L2).
  unsigned nb = cols / 256;
  uint64_t wbytes = (uint64_t)rows * nb * 144;
  if (wbytes > (128ull << 20)) {
    fprintf(stderr, "%ux%u: %llu bytes pass the default storage binding limit\n", rows, cols, (unsigned long long)wbytes);
    return 1;
  }
  int nw = (int)((256ull << 20) / wbytes) + 2;
  if (nw > 64) nw = 64;
  uint8_t *wh = malloc(wbytes);
  srand(7);
  for (uint64_t i = 0; i < wbytes; i++) wh[i] = rand() & 255;
  for (uint64_t b = 0; b < (uint64_t)rows * nb; b++) { // d and dmin small and finite
    uint16_t d = 0x2000 | (rand() & 0x3ff), dm = 0x1c00 | (rand() & 0x3ff);
    memcpy(wh + 144 * b, &d, 2);
    memcpy(wh + 144 * b + 2, &dm, 2);
  }
  WGPUBuffer *W = malloc(nw * sizeof *W);
  for (int i = 0; i < nw; i++) {
    W[i] = buffer(wbytes, WGPUBufferUsage_Storage | WGPUBufferUsage_CopyDst);
    wgpuQueueWriteBuffer(queue, W[i], 0, wh, wbytes);
  }
  // x: cols int8 values in groups of 16, each group's scale and sum.
  int8_t *xi = malloc(cols);
  float *xsh = malloc(cols / 16 * 2 * sizeof(float));
  for (unsigned g = 0; g < cols / 16; g++) {
    float scale = 0.01f + (rand() % 100) * 1e-4f;
    int sum = 0;
    for (int k = 0; k < 16; k++) {
      xi[16 * g + k] = (int8_t)(rand() % 255 - 127);
      sum += xi[16 * g + k];
    }
    xsh[2 * g] = scale;
    xsh[2 * g + 1] = scale * sum;
  }
  WGPUBuffer X = buffer(cols, WGPUBufferUsage_Storage | WGPUBufferUsage_CopyDst);
  wgpuQueueWriteBuffer(queue, X, 0, xi, cols);
  WGPUBuffer XS = buffer(cols / 16 * 8, WGPUBufferUsage_Storage | WGPUBufferUsage_CopyDst);
  wgpuQueueWriteBuffer(queue, XS, 0, xsh, cols / 16 * 8);
  WGPUBuffer Y = buffer(rows * 4, WGPUBufferUsage_Storage | WGPUBufferUsage_CopySrc);
  unsigned perWG = rt * wg / 8 / spr;
  unsigned ngroups = (rows + perWG - 1) / perWG, gx = ngroups, gy = 1;
  while (gx > 65535) { gy++; gx = (ngroups + gy - 1) / gy; }
  WGPUComputePipeline kp;
  WGPUBindGroup *kb = malloc(nw * sizeof *kb);
  if (!ours) {
    uint32_t params[4] = {rows, nb, gx, 0};
    WGPUBuffer P = buffer(16, WGPUBufferUsage_Uniform | WGPUBufferUsage_CopyDst);
    wgpuQueueWriteBuffer(queue, P, 0, params, 16);
    char *src = readFile(argv[1]);
    src = setConst(src, "ROWS", rt);
    src = setConst(src, "SPR", spr);
    src = setConst(src, "WG", wg);
    kp = pipeline(src);
    for (int i = 0; i < nw; i++) {
      WGPUBuffer bs[5] = {W[i], X, XS, Y, P};
      uint64_t ss[5] = {wbytes, cols, cols / 16 * 8, rows * 4, 16};
      kb[i] = bind(kp, 5, bs, ss);
    }
  } else {
    // The op library's form of x: a group's first vec4 holds v(4k+2) +
    // 65536 v(4k) in word k, its second v(4k+3) + 65536 v(4k+1), its third
    // the scale and the sum (quantize_x.wgsl).
    unsigned ng = cols / 16;
    uint32_t *xo = calloc(ng * 12, 4);
    for (unsigned g = 0; g < ng; g++) {
      const int8_t *v = xi + 16 * g;
      for (int k = 0; k < 4; k++) {
        xo[12 * g + k] = (uint32_t)((int32_t)v[4 * k + 2] + (int32_t)v[4 * k] * 65536);
        xo[12 * g + 4 + k] = (uint32_t)((int32_t)v[4 * k + 3] + (int32_t)v[4 * k + 1] * 65536);
      }
      memcpy(&xo[12 * g + 8], &xsh[2 * g], 4);
      memcpy(&xo[12 * g + 9], &xsh[2 * g + 1], 4);
    }
    WGPUBuffer XO = buffer(ng * 48, WGPUBufferUsage_Storage | WGPUBufferUsage_CopyDst);
    wgpuQueueWriteBuffer(queue, XO, 0, xo, ng * 48);
    char path[512];
    snprintf(path, sizeof path, "%s.launch", argv[1]);
    char *launch = readFile(path);
    unsigned gz = 1;
    char hexs[4096] = {0};
    if (sscanf(launch, "%u %u %u %4095s", &gx, &gy, &gz, hexs) != 4 || gz != 1) { fprintf(stderr, "bad %s\n", path); return 1; }
    size_t pn = strlen(hexs) / 2;
    uint8_t *pb = malloc(pn);
    for (size_t i = 0; i < pn; i++) sscanf(hexs + 2 * i, "%2hhx", &pb[i]);
    WGPUBuffer P = buffer(pn, WGPUBufferUsage_Uniform | WGPUBufferUsage_CopyDst);
    wgpuQueueWriteBuffer(queue, P, 0, pb, pn);
    snprintf(path, sizeof path, "%s.wgsl", argv[1]);
    kp = pipeline(readFile(path));
    for (int i = 0; i < nw; i++) {
      WGPUBuffer bs[3] = {W[i], XO, Y};
      uint64_t ss[3] = {wbytes, ng * 48, rows * 4};
      kb[i] = bind(kp, 3, bs, ss);
    }
    WGPUBuffer pbs[1] = {P};
    uint64_t pss[1] = {pn};
    group1 = bindAt(kp, 1, 1, pbs, pss);
    rt = spr = wg = 0; // the op library's layout: see dump's output
  }

  // Check against the CPU (weights copy 0).
  run(kp, kb, 1, gx, gy, 1);
  WGPUBuffer RB = buffer(rows * 4, WGPUBufferUsage_MapRead | WGPUBufferUsage_CopyDst);
  WGPUCommandEncoder enc = wgpuDeviceCreateCommandEncoder(device, NULL);
  wgpuCommandEncoderCopyBufferToBuffer(enc, Y, 0, RB, 0, rows * 4);
  WGPUCommandBuffer cb = wgpuCommandEncoderFinish(enc, NULL);
  wgpuQueueSubmit(queue, 1, &cb);
  WGPUBufferMapCallbackInfo mc = {0};
  mc.mode = WGPUCallbackMode_AllowProcessEvents;
  mc.callback = onMap;
  done = 0;
  wgpuBufferMapAsync(RB, WGPUMapMode_Read, 0, rows * 4, mc);
  wait();
  const float *yg = wgpuBufferGetConstMappedRange(RB, 0, rows * 4);
  double worst = 0, big = 0;
  for (unsigned r = 0; r < rows; r++) {
    double acc = 0;
    for (unsigned b = 0; b < nb; b++) {
      const uint8_t *blk = wh + 144 * ((uint64_t)r * nb + b);
      uint16_t dh, mh;
      memcpy(&dh, blk, 2);
      memcpy(&mh, blk + 2, 2);
      double d = half2float(dh), dmin = half2float(mh);
      for (int s = 0; s < 8; s++) {
        int sc, m;
        scaleMin(blk + 4, s, &sc, &m);
        for (int hg = 0; hg < 2; hg++) { // two groups of 16 of x a sub-block
          unsigned g = b * 16 + 2 * s + hg;
          long isum = 0;
          for (int k = 0; k < 16; k++) {
            int wi = 16 * hg + k; // weight index in the sub-block
            const uint8_t qb = blk[16 + 32 * (s / 2) + wi];
            int qv = (s & 1) ? qb >> 4 : qb & 15;
            isum += qv * xi[16 * g + k];
          }
          acc += d * sc * xsh[2 * g] * isum - dmin * m * xsh[2 * g + 1];
        }
      }
    }
    worst = fmax(worst, fabs(acc - yg[r]));
    big = fmax(big, fabs(acc));
  }
  printf("check: worst |gpu - cpu| %.3g of the largest %.3g (%.2g)\n", worst, big, worst / big);
  wgpuBufferUnmap(RB);

  // A copy kernel moving as many bytes (half read, half written), over
  // buffers rotated beyond the L2.
  uint64_t cn = wbytes / 2 / 16 * 16;
  const char *copySrc =
      "@group(0) @binding(0) var<storage, read> s: array<vec4<u32>>;\n"
      "@group(0) @binding(1) var<storage, read_write> d: array<vec4<u32>>;\n"
      "@compute @workgroup_size(256) fn main(@builtin(global_invocation_id) g: vec3<u32>) {\n"
      "  let i = g.x + g.y * 65535u * 256u;\n"
      "  if (i < arrayLength(&d)) { d[i] = s[i]; }\n"
      "}\n";
  WGPUComputePipeline cp = pipeline(copySrc);
  copyPipe = cp;
  int nc = (int)((256ull << 20) / (2 * cn)) + 2;
  if (nc > 64) nc = 64;
  WGPUBindGroup *cbg = malloc(nc * sizeof *cbg);
  for (int i = 0; i < nc; i++) {
    WGPUBuffer bs[2] = {buffer(cn, WGPUBufferUsage_Storage), buffer(cn, WGPUBufferUsage_Storage)};
    uint64_t ss[2] = {cn, cn};
    cbg[i] = bind(cp, 2, bs, ss);
  }
  uint64_t cgroups = (cn / 16 + 255) / 256;
  uint32_t cgx = cgroups, cgy = 1;
  while (cgx > 65535) { cgy++; cgx = (cgroups + cgy - 1) / cgy; }

  double kt[5], ct[5];
  run(kp, kb, nw, gx, gy, reps / 4); // warm: clocks up
  for (int i = 0; i < 5; i++) {
    kt[i] = run(kp, kb, nw, gx, gy, reps) / reps;
    ct[i] = run(cp, cbg, nc, cgx, cgy, reps) / reps;
  }
  qsort(kt, 5, sizeof(double), cmpd);
  qsort(ct, 5, sizeof(double), cmpd);
  printf("%s %ux%u, %u rows a thread, %u slots, %u threads: product %.2f us, same-size copy %.2f us: x-of-same-copy %.3f; copy %.0f GB/s (medians of 5 x %d)\n",
         ours ? "q4k_matmul_xq (ours)" : "dp4a", rows, cols, rt, spr, wg, kt[2] * 1e6, ct[2] * 1e6, ct[2] / kt[2], 2 * cn / ct[2] / 1e9, reps);
  return 0;
}
