/** @file safetensors.hpp
 *  @brief Reader and writer of safetensors files (weights, batches, step dumps), validated as
 *  strictly as the reference implementation, with errors that name the file and the fault.
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace dqn::st {

/// The element types this engine reads and writes (a subset of safetensors' dtypes).
enum class DType { F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL };

/// Bytes per element.
std::size_t dtype_size(DType);
/// The name used in the header: "F64", "F32", ..., "BOOL".
const char* dtype_name(DType);
/// Inverse of dtype_name; nullopt for a name this engine does not support.
std::optional<DType> dtype_from_name(std::string_view name);

/// IEEE half / bfloat16 bit patterns to float (exact: every value is representable).
float f16_to_f32(std::uint16_t bits);
float bf16_to_f32(std::uint16_t bits);

/// "[3,4]"; "[]" for a scalar.
std::string shape_str(const std::vector<std::int64_t>& shape);

/// One tensor: row-major, little-endian element bytes.
struct Tensor {
  DType dtype = DType::F32;
  std::vector<std::int64_t> shape;  ///< empty = scalar (one element)
  std::vector<std::uint8_t> bytes;  ///< numel() * dtype_size(dtype) bytes
  /// Product of the dimensions (1 for a scalar, 0 if any dimension is 0).
  std::int64_t numel() const;
};

/// Every failure of this module. what() = "safetensors file '<path>': <reason>"; path() is
/// empty for a File that was never read from disk, and then what() = "safetensors: <reason>".
class Error : public std::runtime_error {
 public:
  Error(std::string path, std::string reason);
  const std::string& path() const { return path_; }
  const std::string& reason() const { return reason_; }

 private:
  std::string path_;
  std::string reason_;
};

/// The contents of one file. `tensors` and `metadata` may be edited directly; write_file
/// validates them again before it touches the disk.
class File {
 public:
  /// Adds or replaces a tensor; Error if the name is empty or "__metadata__", a dimension is
  /// negative, or bytes.size() differs from numel * dtype size.
  void put(const std::string& name, Tensor t);
  /// Copy numel(shape) elements from data (which may be null when numel is 0).
  void put_f32(const std::string& name, std::vector<std::int64_t> shape, const float* data);
  void put_i32(const std::string& name, std::vector<std::int64_t> shape, const std::int32_t* data);
  void put_i64(const std::string& name, std::vector<std::int64_t> shape, const std::int64_t* data);

  /// Adds numel(shape) elements of `dtype` copied from data as they are (bit-exact state).
  void put_raw(const std::string& name, DType dtype, std::vector<std::int64_t> shape, const void* data);
  /// Copies a tensor's bytes into out; Error naming the tensor unless its dtype and shape are
  /// exactly these.
  void get_raw(const std::string& name, DType dtype, const std::vector<std::int64_t>& shape, void* out) const;

  bool has(const std::string& name) const;
  /// Error naming the missing tensor and listing a few present ones (closest names first).
  const Tensor& get(const std::string& name) const;

  /// The typed getters check the shape when expect_shape is non-empty ("tensor 'x' has shape
  /// [3,4], expected [4,4]"); an empty expect_shape accepts any shape, scalars included.
  /// get_f32 converts F64 (range-checked), F32, BF16 and F16; other dtypes are an Error.
  std::vector<float> get_f32(const std::string& name,
                             const std::vector<std::int64_t>& expect_shape = {}) const;
  /// Accepts I32, or I64 whose every element fits in i32.
  std::vector<std::int32_t> get_i32(const std::string& name,
                                    const std::vector<std::int64_t>& expect_shape = {}) const;
  /// Accepts I64 or I32.
  std::vector<std::int64_t> get_i64(const std::string& name,
                                    const std::vector<std::int64_t>& expect_shape = {}) const;
  /// A single element (shape [] or [1]), e.g. "adam.step".
  std::int64_t get_scalar_i64(const std::string& name) const;
  float get_scalar_f32(const std::string& name) const;

  /// Tensor names, sorted.
  std::vector<std::string> names() const;

  std::map<std::string, std::string> metadata;  ///< the header's "__metadata__"
  std::map<std::string, Tensor> tensors;
  std::string path;  ///< the file this was read from (set by read_file), for error messages

 private:
  const Tensor& get_checked(const std::string& name,
                            const std::vector<std::int64_t>& expect_shape) const;
};

/// Reads and validates a whole file; throws Error naming the path and the fault: cannot open
/// (strerror), not a regular file, shorter than 8 bytes, header length over 100 MB or past the
/// end of the file, header empty / with a NUL byte / not valid JSON (parser position) / not an
/// object / repeating a key, "__metadata__" not an object of strings, an entry that is not an
/// object or lacks or mistypes "dtype", "shape" or "data_offsets", an unsupported dtype, a
/// negative or overflowing shape, offsets whose span differs from shape x dtype size, a tensor
/// past the end of the data ("truncated: ..."), and overlaps, gaps or trailing bytes (the tensors
/// must cover the data section exactly, as the reference reader requires). Stricter than the
/// reference reader only in refusing repeated keys, which it resolves silently.
File read_file(const std::string& path);
/// Parses an in-memory image of a file; `path` is used only in error messages.
File parse(const std::vector<std::uint8_t>& image, const std::string& path);

/// The exact bytes write_file stores: tensors ordered by descending dtype alignment then name
/// (as the reference writer orders them, so every tensor's data is aligned to its element size),
/// compact JSON header padded with spaces to a multiple of 8, "__metadata__" first when non-empty.
std::vector<std::uint8_t> serialize(const File& f, const std::string& path_for_errors = "");

/// Atomic: writes "<path>.tmp.<pid>", fsyncs, renames over path, fsyncs the directory. On any
/// failure the temporary is removed, an existing file at path is untouched, and the Error names
/// the path and the errno text. Two threads of one process must not write the same path at once.
void write_file(const std::string& path, const File& f);
/// Any bytes into path the same way (atomically; an Error naming the path on a failure).
void write_bytes(const std::string& path, const std::string& bytes);

}  // namespace dqn::st
