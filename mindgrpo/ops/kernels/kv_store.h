// The fused decode kernels' KV cache: memory they own, outside MindSpore, resident only where written.
//
// A store holds, per layer and kind (keys, values), `rows` cache rows of [KV, L, D] floats, each row padded to
// whole pages, in one anonymous private mapping. A page takes physical memory when a kernel first writes it, and
// `release` (madvise MADV_DONTNEED) gives pages back, so the memory of a cache follows the tokens actually written
// into it rather than its full shape. Kernels name a store by an id (the registry below); mindgrpo/ops/kv_store.py
// creates, releases and destroys stores through the extern "C" functions of decode_step_cpu.cc.
#ifndef MINDGRPO_KV_STORE_H_
#define MINDGRPO_KV_STORE_H_

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <mutex>
#include <unordered_map>

namespace mindgrpo {

class KvStore {
 public:
  KvStore(int64_t rows, int64_t kv, int64_t len, int64_t dim, int64_t layers)
      : rows(rows), kv(kv), len(len), dim(dim), layers(layers) {
    const int64_t page_floats = sysconf(_SC_PAGESIZE) / static_cast<int64_t>(sizeof(float));
    row_stride = (kv * len * dim + page_floats - 1) / page_floats * page_floats;
    bytes_ = static_cast<size_t>(layers * 2 * rows * row_stride) * sizeof(float);
    void *mapped = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    base_ = mapped == MAP_FAILED ? nullptr : static_cast<float *>(mapped);
  }
  ~KvStore() {
    if (base_ != nullptr) munmap(base_, bytes_);
  }
  KvStore(const KvStore &) = delete;
  KvStore &operator=(const KvStore &) = delete;

  bool ok() const { return base_ != nullptr; }

  // Row r of layer `layer`'s keys (kind 0) or values (kind 1): [KV, L, D].
  float *row(int64_t layer, int kind, int64_t r) const { return base_ + ((layer * 2 + kind) * rows + r) * row_stride; }

  // Give the pages of rows `which[0..count)` back in every layer (they read as zeros until written again).
  void release_rows(const int32_t *which, int64_t count) const {
    for (int64_t layer = 0; layer < layers; ++layer) {
      for (int kind = 0; kind < 2; ++kind) {
        for (int64_t i = 0; i < count; ++i) {
          madvise(row(layer, kind, which[i]), row_stride * sizeof(float), MADV_DONTNEED);
        }
      }
    }
  }

  void release_all() const { madvise(base_, bytes_, MADV_DONTNEED); }

  const int64_t rows, kv, len, dim, layers;
  int64_t row_stride;  // floats from one row to the next (KV * L * D rounded up to whole pages)

 private:
  float *base_;
  size_t bytes_;
};

// Stores by id. Kernels only look stores up; creation and destruction happen between graph runs (Python side).
inline std::mutex &store_mutex() {
  static std::mutex mutex;
  return mutex;
}

inline std::unordered_map<int64_t, KvStore *> &stores() {
  static std::unordered_map<int64_t, KvStore *> registry;
  return registry;
}

inline KvStore *find_store(int64_t id) {
  std::lock_guard<std::mutex> lock(store_mutex());
  auto it = stores().find(id);
  return it == stores().end() ? nullptr : it->second;
}

}  // namespace mindgrpo

#endif  // MINDGRPO_KV_STORE_H_
