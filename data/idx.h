// IDX files, the format of MNIST and Fashion-MNIST: two zero bytes, a type
// byte, a dimension count n, n big-endian uint32 sizes, then the payload in
// big-endian row-major order. Files may be gzip-compressed (detected by their
// first bytes, not their name).
//
// The reader trusts nothing in the file: it checks the magic and type bytes,
// the number of dimensions for the file's role, that the product of the sizes
// fits in 64 bits and matches the payload exactly (no truncation, no trailing
// bytes), and gzip's CRC-32 and length. Every failure is a kiln::Error whose
// message starts with the file's path and names the problem.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace kiln {

// What a file is for: images are uint8 with 3 dims (N, H, W), labels uint8
// with 1 dim (N); any accepts every type and dimension count.
enum class IdxRole { any, images, labels };

// Reads an IDX file (raw or gzip) into a contiguous CPU tensor. uint8 stays
// uint8; int8, int16 and int32 become int32; float32 and float64 keep theirs.
// Throws kiln::Error naming `path` and the problem.
Tensor read_idx(const std::string& path, IdxRole role = IdxRole::any);

// Parses an IDX file already in memory (decompressed); `name` goes into errors.
Tensor parse_idx(std::vector<uint8_t> bytes, const std::string& name, IdxRole role = IdxRole::any);

// The bytes of a file, gunzipped when it starts with the gzip magic (several
// gzip members are concatenated, as gzip does). Throws kiln::Error naming the
// file on a read error, a truncated or corrupted stream (CRC-32 or length
// mismatch) or trailing bytes after the last member.
std::vector<uint8_t> read_file_bytes(const std::string& path);

// read_file_bytes' decompression of bytes already in memory (for the fuzz
// target); `name` goes into errors, which are read_file_bytes'.
std::vector<uint8_t> gunzip(const std::vector<uint8_t>& compressed, const std::string& name);

// Checks that an images tensor (N, ...) and a labels tensor (M) from IDX files
// belong together: N == M and every label is in [0, num_classes).
void check_idx_images_labels(const Tensor& images, const Tensor& labels, int64_t num_classes,
                             const std::string& images_path, const std::string& labels_path);

}  // namespace kiln
