// nvlink_push_bw — how fast can SMs write (or read) a peer GPU's memory, both
// GPUs at once, against the copy engines? Sizes the pushed layout's transfer
// (the GEMM's storer warp copies each finished tile to the peer) and tells
// whether more warps per SM would move the last wave faster.
//
// Usage: nvlink_push_bw [MiB per direction, default 64]   (needs 2 GPUs with P2P)
// Prints one line per mode: GB/s per direction, median of 10 runs, the slower GPU.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                                                  \
  do {                                                                                         \
    cudaError_t e_ = (x);                                                                      \
    if (e_ != cudaSuccess) {                                                                   \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      return 1;                                                                                \
    }                                                                                          \
  } while (0)

// Each thread moves 4 independent 16-byte units per step (loads first, then
// stores), grid-stride over the buffer.
__global__ void copy16(const uint4* __restrict__ src, uint4* __restrict__ dst, size_t units) {
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < units; i += 4 * stride) {
    uint4 v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) v[u] = src[i + u * stride];
#pragma unroll
    for (int u = 0; u < 4; ++u) dst[i + u * stride] = v[u];
  }
  for (; i < units; i += stride) dst[i] = src[i];
}

int main(int argc, char** argv) {
  const size_t mib = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 64;
  const size_t bytes = mib << 20;
  int n = 0;
  CK(cudaGetDeviceCount(&n));
  if (n < 2) {
    std::printf("nvlink_push_bw: needs 2 GPUs, found %d (skipped)\n", n);
    return 0;
  }
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  void *local[2], *remote_dst[2];  // remote_dst[d]: on GPU 1-d, written by GPU d
  cudaStream_t st[2];
  cudaEvent_t ev[2][2];
  for (int d = 0; d < 2; ++d) {
    CK(cudaSetDevice(d));
    int ok = 0;
    CK(cudaDeviceCanAccessPeer(&ok, d, 1 - d));
    if (!ok) {
      std::printf("nvlink_push_bw: GPU %d cannot access GPU %d (skipped)\n", d, 1 - d);
      return 0;
    }
    CK(cudaDeviceEnablePeerAccess(1 - d, 0));
    CK(cudaMalloc(&local[d], bytes));
    CK(cudaMemset(local[d], d + 1, bytes));
    CK(cudaStreamCreateWithFlags(&st[d], cudaStreamNonBlocking));
    CK(cudaEventCreate(&ev[d][0]));
    CK(cudaEventCreate(&ev[d][1]));
  }
  for (int d = 0; d < 2; ++d) {
    CK(cudaSetDevice(1 - d));
    CK(cudaMalloc(&remote_dst[d], bytes));
  }
  // mode: 0 SM push (local -> peer), 1 SM pull (peer -> local), 2 copy engine push
  auto run = [&](int mode, int ctas, int warps, double* gbps) -> int {
    std::vector<double> t;
    for (int rep = 0; rep < 13; ++rep) {
      for (int d = 0; d < 2; ++d) {
        CK(cudaSetDevice(d));
        CK(cudaEventRecord(ev[d][0], st[d]));
      }
      for (int d = 0; d < 2; ++d) {
        CK(cudaSetDevice(d));
        if (mode == 2) {
          CK(cudaMemcpyPeerAsync(remote_dst[d], 1 - d, local[d], d, bytes, st[d]));
        } else {
          // pull: GPU d reads what GPU 1-d holds (local[1-d]) into its own buffer remote_dst[1-d]
          const void* src = mode == 0 ? local[d] : local[1 - d];
          void* dst = mode == 0 ? remote_dst[d] : remote_dst[1 - d];
          copy16<<<ctas, warps * 32, 0, st[d]>>>(static_cast<const uint4*>(src), static_cast<uint4*>(dst), bytes / 16);
          CK(cudaGetLastError());
        }
        CK(cudaEventRecord(ev[d][1], st[d]));
      }
      double worst = 0;
      for (int d = 0; d < 2; ++d) {
        CK(cudaSetDevice(d));
        CK(cudaEventSynchronize(ev[d][1]));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, ev[d][0], ev[d][1]));
        worst = std::max(worst, double(ms));
      }
      if (rep >= 3) t.push_back(worst);
    }
    std::sort(t.begin(), t.end());
    *gbps = double(bytes) / (t[t.size() / 2] * 1e-3) / 1e9;
    return 0;
  };
  std::printf("# %zu MiB each way, both GPUs at once; GB/s per direction (median of 10, slower GPU)\n", mib);
  std::printf("%-10s %6s %6s %9s\n", "mode", "ctas", "warps", "GB/s");
  double g = 0;
  if (run(2, 0, 0, &g)) return 1;
  std::printf("%-10s %6s %6s %9.1f\n", "ce-push", "-", "-", g);
  const int cta_set[] = {sms, sms / 2, 2 * sms};
  const int warp_set[] = {1, 2, 4, 8, 16};
  for (int mode = 0; mode < 2; ++mode)
    for (int c : cta_set)
      for (int w : warp_set) {
        if (run(mode, c, w, &g)) return 1;
        std::printf("%-10s %6d %6d %9.1f\n", mode == 0 ? "sm-push" : "sm-pull", c, w, g);
      }
  return 0;
}
