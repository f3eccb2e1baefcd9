/** @file registry.hpp
 *  @brief The central pointer registry: every buffer and parameter is declared by name up front,
 *  freeze() lays them all out in one aligned arena allocated once, and every pointer is resolved
 *  before the first step. After seal() a lookup by name is an error (and counted).
 */
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "dqn/backend.hpp"
#include "dqn/head.hpp"

namespace dqn {

class Runtime;

const char* to_string(BufferKind k);
const char* to_string(DType d);

class Registry {
 public:
  struct Buffer {
    std::string name, owner;
    DType dtype = DType::real;
    std::vector<std::int64_t> shape;
    BufferKind kind = BufferKind::scratch;
    std::string view_of;           ///< non-empty: a view into another buffer
    std::int64_t view_offset = 0;  ///< in elements of the parent
    std::size_t offset_bytes = 0;  ///< into the arena (after freeze)
    std::size_t bytes = 0;
    std::int64_t numel() const;
  };
  struct Param {
    std::string name, owner;
    std::int32_t rows = 0, cols = 0;  ///< cols 0: a vector of `rows`
    std::int32_t fan_in = 1;
    std::uint32_t flags = 0;
    std::int64_t offset = 0;          ///< in elements of the flat parameter vector
    std::int32_t stored_rows = 0;     ///< rows held in the flat vector: rows, or align_elems(rows) (kParamPadRows)
    std::int64_t numel() const { return cols == 0 ? rows : std::int64_t(rows) * cols; }
    /// Elements held from offset on: numel() and the zero rows of kParamPadRows.
    std::int64_t stored() const { return cols == 0 ? stored_rows : std::int64_t(stored_rows) * cols; }
    std::vector<std::int64_t> shape() const;
  };

  /// Throws std::invalid_argument naming both owners on a duplicate, and on bad shapes.
  void declare(const std::string& name, DType dtype, std::vector<std::int64_t> shape,
               BufferKind kind, const std::string& owner);
  /// A named window [offset, offset+numel(shape)) of an existing buffer (same dtype).
  void declare_view(const std::string& name, const std::string& parent, std::int64_t offset,
                    std::vector<std::int64_t> shape, const std::string& owner);
  void declare_param(const std::string& name, std::int32_t rows, std::int32_t cols,
                     std::int32_t fan_in, std::uint32_t flags, const std::string& owner);

  bool has(const std::string& name) const;
  const Buffer* find(const std::string& name) const;
  const Param* find_param(const std::string& name) const;
  const std::vector<Param>& params() const { return params_; }
  std::int64_t param_count() const { return param_total_; }  ///< P
  const std::vector<std::string>& buffer_order() const { return order_; }

  /// Lays out the arena (kinds grouped, each buffer 256-byte aligned) and allocates it once
  /// through the runtime; zero-fills it.
  void freeze(Runtime& rt);
  bool frozen() const { return base_ != nullptr; }
  /// From now on (the first step), any lookup throws and is counted.
  void seal() { sealed_ = true; }
  void unseal() { sealed_ = false; }  ///< for checkpoint I/O between steps

  // Resolution (counted; an error after seal()).
  Real real(const std::string& name) const;
  std::int32_t* i32(const std::string& name) const;
  std::int64_t* i64(const std::string& name) const;
  void* raw(const std::string& name) const;
  /// A parameter tensor inside a flat [P] buffer ("params", "target", "adam.m", a grad row...).
  Real param_in(const Real& flat, const std::string& param) const;

  std::size_t arena_bytes() const { return arena_bytes_; }
  std::uint32_t real_size() const { return real_size_; }
  std::size_t element_size(DType d) const;
  char* base() const { return base_; }
  /// The contiguous byte range holding every report buffer (for one async copy).
  std::pair<std::size_t, std::size_t> report_range() const { return report_range_; }

  std::int64_t lookups() const { return lookups_; }
  std::int64_t lookups_after_seal() const { return late_lookups_; }
  std::int64_t arena_allocations() const { return allocations_; }

  /// Human-readable layout: one line per buffer (name, kind, dtype, shape, offset, bytes).
  std::string layout_text() const;

 private:
  const Buffer& lookup(const std::string& name) const;

  std::map<std::string, Buffer> buffers_;
  std::vector<std::string> order_;
  std::vector<Param> params_;
  std::map<std::string, std::size_t> param_index_;
  std::int64_t param_total_ = 0;

  char* base_ = nullptr;
  std::size_t arena_bytes_ = 0;
  std::uint32_t real_size_ = 4;
  std::pair<std::size_t, std::size_t> report_range_{0, 0};
  bool sealed_ = false;
  mutable std::int64_t lookups_ = 0, late_lookups_ = 0;
  std::int64_t allocations_ = 0;
};

/// Element ranges [lo, hi) sorted and merged (overlapping or touching ones joined), then, while
/// more than `max` remain, the two with the smallest gap between them joined (the gap included).
/// The result covers every input element in at most `max` ranges (max >= 1).
std::vector<std::pair<std::int64_t, std::int64_t>> merge_ranges(std::vector<std::pair<std::int64_t, std::int64_t>> r,
                                                                std::size_t max);

}  // namespace dqn
