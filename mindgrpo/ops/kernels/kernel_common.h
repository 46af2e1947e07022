// What the CPU kernels share (header-only; the kernel build hashes this folder's headers).
#ifndef MINDGRPO_KERNEL_COMMON_H_
#define MINDGRPO_KERNEL_COMMON_H_

#include <algorithm>
#include <cstdint>
#include <cstring>

// On x86-64 build AVX-512 and AVX2+FMA clones next to the baseline one; the loader picks per machine (ifunc), so
// the cached library stays portable across the CPUs that share a home folder. (Measured on the 2-core EPYC dev
// box, forward at [64, 1024]: baseline SSE2 530 us, AVX2 200 us, AVX-512 105 us.)
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define MINDGRPO_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define MINDGRPO_CLONES
#endif

namespace mindgrpo {

// Elements of a tensor of rank ndim (1 for a scalar).
inline int64_t numel(int ndim, const int64_t *shape) {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[i];
  return n;
}

// MindSpore names a float32 tensor's dtype "float32" (some versions "float").
inline bool is_float32(const char *dtype) {
  return std::strcmp(dtype, "float32") == 0 || std::strcmp(dtype, "float") == 0;
}

inline bool all_float32(int count, const char **dtypes) {
  for (int i = 0; i < count; ++i) {
    if (!is_float32(dtypes[i])) return false;
  }
  return true;
}

// expf to ~1 ulp (Cephes polynomial) written so the compiler can vectorise it; libm's expf would be a call per
// element. Cody-Waite range reduction x = n ln2 + r, |r| <= ln2/2, then 2^n is built in the exponent bits.
inline float vexp(float x) {
  // Keep 2^n a normal float: saturates at exp(-87.3) ~ 1.2e-38 and exp(88.3) ~ 2.1e38 instead of 0 / inf.
  x = std::min(std::max(x, -87.3f), 88.3f);
  const float t = x * 1.44269504088896341f + 12582912.0f;  // 1.5*2^23: round-to-nearest without roundf
  const float n = t - 12582912.0f;
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  const float z = r * r;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * z + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return y * scale;
}

}  // namespace mindgrpo

#endif  // MINDGRPO_KERNEL_COMMON_H_
