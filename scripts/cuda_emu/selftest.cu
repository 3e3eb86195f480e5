// The emulator's primitives against CUDA's documented semantics (a test of
// emu_cuda.h, not of kiln): shuffles of every kind and width, 2-D blocks and
// grids, static and dynamic __shared__ arrays with __syncthreads, threads that
// return early, atomics. Written as CUDA and rewritten by gen_cu.py like the
// kernel files. Run: bash scripts/cuda_emu/run_kernels.sh selftest
#include <cstdint>
#include <cstdio>

namespace selftest {

// out[8 * t + k]: the shuffles of lane values v = 100 * t + 0.5 of linear thread t.
__global__ void shuffles(float* out, double* out_double, int* out_int) {
  const int t = threadIdx.x + threadIdx.y * blockDim.x + blockIdx.x * blockDim.x * blockDim.y;
  const float v = 100.0f * t + 0.5f;
  float* o = out + 8 * t;
  o[0] = __shfl_down_sync(0xffffffffu, v, 1);
  o[1] = __shfl_up_sync(0xffffffffu, v, 3);
  o[2] = __shfl_xor_sync(0xffffffffu, v, 5);
  o[3] = __shfl_sync(0xffffffffu, v, 7);
  o[4] = __shfl_down_sync(0xffffffffu, v, 2, 8);
  o[5] = __shfl_up_sync(0xffffffffu, v, 1, 8);
  o[6] = __shfl_xor_sync(0xffffffffu, v, 4, 16);
  o[7] = __shfl_sync(0xffffffffu, v, 9, 8);
  out_double[t] = __shfl_xor_sync(0xffffffffu, static_cast<double>(v) + 0.25, 16);
  out_int[t] = __shfl_down_sync(0xffffffffu, t, 16);
}

// Reverses each block's 64 values through shared memory; blocks on a 2-D grid.
__global__ void reverse(const int* in, int* out) {
  __shared__ int tile[64], spare[3];
  const int t = threadIdx.x + threadIdx.y * blockDim.x;
  const int block = blockIdx.x + blockIdx.y * gridDim.x;
  if (t == 0) spare[0] = block;
  tile[t] = in[block * 64 + t];
  __syncthreads();
  out[block * 64 + t] = tile[63 - t] + 1000 * (spare[0] - block);
}

// Threads past `live` return; the rest still meet at __syncthreads.
__global__ void early_exit(int live, int* out) {
  extern __shared__ int dynamic[];
  if (static_cast<int>(threadIdx.x) >= live) return;
  dynamic[threadIdx.x] = static_cast<int>(threadIdx.x) * 2;
  __syncthreads();
  out[blockIdx.x * blockDim.x + threadIdx.x] = dynamic[live - 1 - threadIdx.x];
}

__global__ void atomics(float* sum, int* first, unsigned long long* count) {
  atomicAdd(sum, 0.5f);
  atomicAdd(count, 1ull);
  atomicCAS(first, -1, static_cast<int>(blockIdx.x));
}

// Host launchers, as a kernel file has them.
void run_shuffles(float* out, double* out_double, int* out_int) {
  shuffles<<<2, dim3(32, 2)>>>(out, out_double, out_int);
}
void run_reverse(const int* in, int* out) { reverse<<<dim3(2, 3), dim3(16, 4)>>>(in, out); }
void run_early_exit(int live, int* out) { early_exit<<<3, 96, 96 * sizeof(int)>>>(live, out); }
void run_atomics(int blocks, float* sum, int* first, unsigned long long* count) {
  atomics<<<blocks, 256, 0, nullptr>>>(sum, first, count);
}

}  // namespace selftest
