// IDX files (the MNIST family's format), gzip-compressed: magic 0x0000 TT NN (TT = 0x08 for
// unsigned bytes, NN = number of dimensions), NN big-endian u32 sizes, then the payload.
#pragma once
#include <ATen/ATen.h>

#include <stdexcept>
#include <string>

namespace mf {

class DataError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Reads a gzip IDX file of unsigned bytes with `dims` dimensions into a uint8 tensor.
// Throws DataError naming the file when it is not gzip, has the wrong magic or number of
// dimensions, is truncated, or has bytes after the payload.
at::Tensor read_idx_gz(const std::string& path, int64_t dims);
// The inverse (tests and `predict` inputs): writes a gzip IDX file of a uint8 tensor.
void write_idx_gz(const std::string& path, const at::Tensor& data);

}  // namespace mf
