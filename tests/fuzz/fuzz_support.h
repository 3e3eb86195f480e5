// Shared by the libFuzzer targets: the input written to one fixed file per
// process (the loaders take paths), and the oracle for errors. A fuzz target
// lets every exception other than kiln::Error escape, so that libFuzzer
// reports it, and aborts when a kiln::Error does not name the file.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "kernels/error.h"

namespace kiln::fuzz {

// The input file of this process, <folder>/kiln-fuzz-<pid>-<tag>: rewritten
// by every run, removed at exit. The folder is /dev/shm when there is one:
// rewriting a file on ext4 (/tmp) waits for its writeback and cuts the runs
// per second tenfold.
struct InputFile {
  explicit InputFile(const std::string& tag)
      : path(std::string(::access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp") + "/kiln-fuzz-" +
             std::to_string(::getpid()) + "-" + tag) {}
  ~InputFile() { std::remove(path.c_str()); }
  const std::string path;
};

inline void write_file(const std::string& path, const uint8_t* data, size_t size) {
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  file.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  if (!file) {
    std::fprintf(stderr, "fuzz: cannot write %s\n", path.c_str());
    std::abort();
  }
}

// Writes [begin, end) as a safetensors file: the JSON header up to the first 0
// byte, then the tensor data. The target writes the 8-byte header length
// itself, so that mutations reach the header's own checks (fuzz_safetensors
// covers the length field).
inline void write_safetensors_input(const std::string& path, const uint8_t* begin, const uint8_t* end) {
  const uint8_t* separator = std::find(begin, end, uint8_t{0});
  const uint64_t header_size = static_cast<uint64_t>(separator - begin);
  std::vector<uint8_t> file(8);
  for (int i = 0; i < 8; ++i) file[i] = static_cast<uint8_t>(header_size >> (8 * i));
  file.insert(file.end(), begin, separator);
  if (separator != end) file.insert(file.end(), separator + 1, end);
  write_file(path, file.data(), file.size());
}

// kiln's standard for bad files: the message says which file.
// KILN_FUZZ_PRINT_ERRORS=1 prints each error (to triage single inputs).
inline void require_names_file(const Error& error, const std::string& name) {
  if (std::getenv("KILN_FUZZ_PRINT_ERRORS") != nullptr) std::fprintf(stderr, "kiln::Error: %s\n", error.what());
  if (error.message().find(name) == std::string::npos) {
    std::fprintf(stderr, "fuzz: a kiln::Error does not name the file '%s': %s\n", name.c_str(), error.what());
    std::abort();
  }
}

}  // namespace kiln::fuzz
