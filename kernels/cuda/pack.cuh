// Pack<T, V>: V adjacent elements moved as one load or store (16 bytes at
// most), for kernels whose threads each own V elements (channels of a row,
// elements of a plane). load_pack / store_pack take the vector instruction
// when the caller has checked that every pointer is 16-byte aligned, else V
// single-element accesses of the same elements: the same values either way.
#pragma once

#include <cstdint>
#include <initializer_list>

namespace kiln::kernels {

template <typename T, int V>
struct alignas(sizeof(T) * V < 16 ? sizeof(T) * V : 16) Pack {
  T v[V];
};

// V for 16 bytes of T.
template <typename T>
constexpr int kFullPack = 16 / static_cast<int>(sizeof(T));

template <typename T, int V>
__device__ __forceinline__ Pack<T, V> load_pack(const T* p, bool aligned) {
  Pack<T, V> out;
  if constexpr (V == 1) {
    out.v[0] = *p;
  } else if (aligned) {
    out = *reinterpret_cast<const Pack<T, V>*>(p);
  } else {
#pragma unroll
    for (int e = 0; e < V; ++e) out.v[e] = p[e];
  }
  return out;
}

template <typename T, int V>
__device__ __forceinline__ void store_pack(T* p, const Pack<T, V>& value, bool aligned) {
  if constexpr (V == 1) {
    *p = value.v[0];
  } else if (aligned) {
    *reinterpret_cast<Pack<T, V>*>(p) = value;
  } else {
#pragma unroll
    for (int e = 0; e < V; ++e) p[e] = value.v[e];
  }
}

// Whether every non-null pointer is 16-byte aligned.
inline bool aligned16(std::initializer_list<const void*> pointers) {
  for (const void* pointer : pointers) {
    if (pointer != nullptr && reinterpret_cast<uintptr_t>(pointer) % 16 != 0) return false;
  }
  return true;
}

}  // namespace kiln::kernels
