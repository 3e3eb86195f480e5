// Decoded data sets cached once per machine in a memory-mapped file, so that
// several training processes share one copy through the page cache instead of
// each decoding and holding its own.
//
// The cache lives in /dev/shm when it exists (RAM-backed), else the system
// temporary directory. A file is named after the data set, carries the key of
// its sources (path, size, mtime) in its header and is rebuilt when the key
// differs. It is never seen half-written: it is written to a temporary file,
// flushed and renamed into place. Builders on one machine take an exclusive
// lock (flock, a blocking wait) so that N processes started together decode
// once. Any failure to use the cache (read-only directory, full disk, a file
// owned by another user) falls back to decoding into private memory.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace kiln {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

// Arrays from the cache: tensors over the mapping (no copy; copy-on-write if
// written) or, after a fallback, over private memory.
class SharedArrays {
 public:
  SharedArrays(NamedTensors arrays, std::string path, bool mapped);
  // Throws kiln::Error when there is no array named `name`.
  Tensor get(const std::string& name) const;
  // True when the arrays are a shared mapping of `path()`.
  bool mapped() const { return mapped_; }
  const std::string& path() const { return path_; }

 private:
  NamedTensors arrays_;
  std::string path_;
  bool mapped_;
};

// /dev/shm when it is a writable directory, else the system temporary directory.
std::string default_cache_dir();

// A key for a source file: its canonical path, size and modification time in
// nanoseconds. Throws kiln::Error naming the file when it cannot be stat'ed.
std::string file_key(const std::string& path);

// The arrays cached as `name` (letters, digits, '-', '_', '.') in `dir`
// (default_cache_dir() when empty): maps the file when its key equals `key`,
// else calls `build` (contiguous CPU tensors), writes them atomically and maps
// the result. Exceptions from `build` propagate. `rebuilt` (optional) is set
// to whether `build` ran.
std::shared_ptr<SharedArrays> load_shared_cache(const std::string& name, const std::string& key,
                                                const std::function<NamedTensors()>& build,
                                                const std::string& dir = "", bool* rebuilt = nullptr);

// 64-bit FNV-1a of `text` as 16 hex digits (for file names).
std::string hash_hex(const std::string& text);

}  // namespace kiln
