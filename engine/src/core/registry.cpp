// The central pointer registry: declaration, one-arena layout, resolution, lookup counting.
#include "core/registry.hpp"

#include <algorithm>
#include <sstream>
#include <stdexcept>

#include "core/runtime.hpp"

namespace dqn {

namespace {
constexpr std::size_t kAlign = 256;

std::string shape_text(const std::vector<std::int64_t>& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (i) out += ',';
    out += std::to_string(s[i]);
  }
  return out + "]";
}

std::size_t align_up(std::size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

// Layout groups: persistent state first, the report block last so it is one contiguous range.
int kind_rank(BufferKind k) {
  switch (k) {
    case BufferKind::parameter: return 0;
    case BufferKind::optimizer: return 1;
    case BufferKind::gradient: return 2;
    case BufferKind::input: return 3;
    case BufferKind::activation: return 4;
    case BufferKind::scratch: return 5;
    case BufferKind::report: return 6;
  }
  return 7;
}
}  // namespace

const char* to_string(BufferKind k) {
  switch (k) {
    case BufferKind::parameter: return "parameter";
    case BufferKind::gradient: return "gradient";
    case BufferKind::optimizer: return "optimizer";
    case BufferKind::activation: return "activation";
    case BufferKind::scratch: return "scratch";
    case BufferKind::input: return "input";
    case BufferKind::report: return "report";
  }
  return "?";
}

const char* to_string(DType d) {
  switch (d) {
    case DType::real: return "real";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
  }
  return "?";
}

std::int64_t Registry::Buffer::numel() const {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

std::vector<std::int64_t> Registry::Param::shape() const {
  if (cols == 0) return {rows};
  return {rows, cols};
}

std::size_t Registry::element_size(DType d) const {
  switch (d) {
    case DType::real: return real_size_;
    case DType::i32: return 4;
    case DType::i64: return 8;
  }
  return 0;
}

void Registry::declare(const std::string& name, DType dtype, std::vector<std::int64_t> shape,
                       BufferKind kind, const std::string& owner) {
  if (frozen()) throw std::logic_error("registry: '" + name + "' declared by '" + owner + "' after freeze()");
  if (name.empty()) throw std::invalid_argument("registry: '" + owner + "' declared a buffer with an empty name");
  if (auto it = buffers_.find(name); it != buffers_.end())
    throw std::invalid_argument("registry: buffer '" + name + "' declared twice: by '" + it->second.owner +
                                "' and by '" + owner + "'");
  for (auto d : shape)
    if (d < 0) throw std::invalid_argument("registry: buffer '" + name + "' (" + owner + ") has a negative dimension " + shape_text(shape));
  Buffer b;
  b.name = name;
  b.owner = owner;
  b.dtype = dtype;
  b.shape = std::move(shape);
  b.kind = kind;
  buffers_.emplace(name, std::move(b));
  order_.push_back(name);
}

void Registry::declare_view(const std::string& name, const std::string& parent, std::int64_t offset,
                            std::vector<std::int64_t> shape, const std::string& owner) {
  auto it = buffers_.find(parent);
  if (it == buffers_.end())
    throw std::invalid_argument("registry: view '" + name + "' (" + owner + ") of unknown buffer '" + parent + "'");
  if (!it->second.view_of.empty())
    throw std::invalid_argument("registry: view '" + name + "' of a view '" + parent + "'");
  const Buffer parent_copy = it->second;
  // Bounds first, so a refused view leaves nothing declared (negative dimensions: declare()).
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  const bool negative = std::any_of(shape.begin(), shape.end(), [](std::int64_t d) { return d < 0; });
  if (!negative && (offset < 0 || offset + n > parent_copy.numel()))
    throw std::invalid_argument("registry: view '" + name + "' [" + std::to_string(offset) + ", " +
                                std::to_string(offset + n) + ") is outside '" + parent + "' (" +
                                std::to_string(parent_copy.numel()) + " elements)");
  declare(name, parent_copy.dtype, std::move(shape), parent_copy.kind, owner);
  Buffer& b = buffers_.at(name);
  b.view_of = parent;
  b.view_offset = offset;
}

void Registry::declare_param(const std::string& name, std::int32_t rows, std::int32_t cols,
                             std::int32_t fan_in, std::uint32_t flags, const std::string& owner) {
  if (frozen()) throw std::logic_error("registry: parameter '" + name + "' declared after freeze()");
  if (auto it = param_index_.find(name); it != param_index_.end())
    throw std::invalid_argument("registry: parameter '" + name + "' declared twice: by '" +
                                params_[it->second].owner + "' and by '" + owner + "'");
  if (rows <= 0 || cols < 0 || fan_in <= 0)
    throw std::invalid_argument("registry: parameter '" + name + "' (" + owner + ") has bad shape " +
                                std::to_string(rows) + "x" + std::to_string(cols) + " fan_in " + std::to_string(fan_in));
  Param p;
  p.name = name;
  p.owner = owner;
  p.rows = rows;
  p.cols = cols;
  p.fan_in = fan_in;
  p.flags = flags;
  p.stored_rows = (flags & kParamPadRows) ? static_cast<std::int32_t>(align_elems(rows)) : rows;
  if (flags & kParamAlign) param_total_ = align_elems(param_total_);
  p.offset = param_total_;
  param_total_ += p.stored();
  param_index_[name] = params_.size();
  params_.push_back(std::move(p));
}

std::vector<std::pair<std::int64_t, std::int64_t>> merge_ranges(std::vector<std::pair<std::int64_t, std::int64_t>> r,
                                                                std::size_t max) {
  std::sort(r.begin(), r.end());
  std::vector<std::pair<std::int64_t, std::int64_t>> m;
  for (const auto& x : r) {
    if (x.second <= x.first) continue;
    if (!m.empty() && x.first <= m.back().second) m.back().second = std::max(m.back().second, x.second);
    else m.push_back(x);
  }
  while (m.size() > std::max<std::size_t>(max, 1)) {  // close the smallest gap
    std::size_t best = 0;
    for (std::size_t i = 1; i + 1 < m.size(); ++i)
      if (m[i + 1].first - m[i].second < m[best + 1].first - m[best].second) best = i;
    m[best].second = m[best + 1].second;
    m.erase(m.begin() + std::ptrdiff_t(best) + 1);
  }
  return m;
}

bool Registry::has(const std::string& name) const { return buffers_.count(name) != 0; }

const Registry::Buffer* Registry::find(const std::string& name) const {
  auto it = buffers_.find(name);
  return it == buffers_.end() ? nullptr : &it->second;
}

const Registry::Param* Registry::find_param(const std::string& name) const {
  auto it = param_index_.find(name);
  return it == param_index_.end() ? nullptr : &params_[it->second];
}

void Registry::freeze(Runtime& rt) {
  if (frozen()) throw std::logic_error("registry: freeze() called twice");
  real_size_ = rt.ops().real_size();
  std::vector<std::string> sorted;
  for (const auto& n : order_)
    if (buffers_.at(n).view_of.empty()) sorted.push_back(n);
  std::stable_sort(sorted.begin(), sorted.end(), [&](const std::string& a, const std::string& b) {
    return kind_rank(buffers_.at(a).kind) < kind_rank(buffers_.at(b).kind);
  });
  std::size_t off = 0;
  bool first_report = true;
  for (const auto& n : sorted) {
    Buffer& b = buffers_.at(n);
    b.bytes = static_cast<std::size_t>(b.numel()) * element_size(b.dtype);
    off = align_up(off);
    b.offset_bytes = off;
    if (b.kind == BufferKind::report) {
      if (first_report) report_range_.first = off;
      first_report = false;
      report_range_.second = off + b.bytes;
    }
    off += b.bytes;
  }
  for (auto& [n, b] : buffers_) {
    if (b.view_of.empty()) continue;
    const Buffer& p = buffers_.at(b.view_of);
    b.bytes = static_cast<std::size_t>(b.numel()) * element_size(b.dtype);
    b.offset_bytes = p.offset_bytes + static_cast<std::size_t>(b.view_offset) * element_size(b.dtype);
  }
  arena_bytes_ = align_up(std::max<std::size_t>(off, kAlign));
  try {
    base_ = static_cast<char*>(rt.alloc_arena(arena_bytes_));
  } catch (const std::exception& e) {
    // Name what the memory is for, so the sizes to lower can be found (the largest three buffers).
    std::vector<const Buffer*> big;
    for (const auto& [name, b] : buffers_)
      if (b.view_of.empty()) big.push_back(&b);
    std::sort(big.begin(), big.end(), [](const Buffer* a, const Buffer* b) { return a->bytes > b->bytes; });
    std::string list;
    for (std::size_t i = 0; i < big.size() && i < 3; ++i)
      list += (i ? ", " : "") + big[i]->name + " " + std::to_string(big[i]->bytes) + " bytes (" + big[i]->owner + ")";
    throw std::runtime_error("cannot allocate the step's memory, " + std::to_string(arena_bytes_) +
                             " bytes in one arena (" + e.what() + "); the largest buffers: " + list +
                             ". Lower batch, the network's sizes or training.replay.capacity");
  }
  ++allocations_;
  rt.ops().fill(Real{base_, real_size_}, 0.0f, static_cast<std::int64_t>(arena_bytes_ / real_size_));
}

const Registry::Buffer& Registry::lookup(const std::string& name) const {
  ++lookups_;
  if (sealed_) {
    ++late_lookups_;
    throw std::logic_error("registry: lookup of '" + name + "' during steps (every pointer must be resolved at init)");
  }
  if (!frozen()) throw std::logic_error("registry: lookup of '" + name + "' before freeze()");
  auto it = buffers_.find(name);
  if (it == buffers_.end()) {
    std::string known;
    int shown = 0;
    for (const auto& n : order_) {
      if (shown++ == 12) { known += ", …"; break; }
      known += (known.empty() ? "" : ", ") + n;
    }
    throw std::invalid_argument("registry: no buffer named '" + name + "' (declared: " + known + ")");
  }
  return it->second;
}

Real Registry::real(const std::string& name) const {
  const Buffer& b = lookup(name);
  if (b.dtype != DType::real) throw std::invalid_argument("registry: '" + name + "' is " + to_string(b.dtype) + ", not real");
  return Real{base_ + b.offset_bytes, real_size_};
}

std::int32_t* Registry::i32(const std::string& name) const {
  const Buffer& b = lookup(name);
  if (b.dtype != DType::i32) throw std::invalid_argument("registry: '" + name + "' is " + to_string(b.dtype) + ", not i32");
  return reinterpret_cast<std::int32_t*>(base_ + b.offset_bytes);
}

std::int64_t* Registry::i64(const std::string& name) const {
  const Buffer& b = lookup(name);
  if (b.dtype != DType::i64) throw std::invalid_argument("registry: '" + name + "' is " + to_string(b.dtype) + ", not i64");
  return reinterpret_cast<std::int64_t*>(base_ + b.offset_bytes);
}

void* Registry::raw(const std::string& name) const { return base_ + lookup(name).offset_bytes; }

Real Registry::param_in(const Real& flat, const std::string& param) const {
  ++lookups_;
  if (sealed_) {
    ++late_lookups_;
    throw std::logic_error("registry: lookup of parameter '" + param + "' during steps");
  }
  const Param* p = find_param(param);
  if (!p) {
    std::string known;
    for (const auto& q : params_) known += (known.empty() ? "" : ", ") + q.name;
    throw std::invalid_argument("registry: no parameter named '" + param + "' (declared: " + known + ")");
  }
  return flat + p->offset;
}

std::string Registry::layout_text() const {
  std::ostringstream os;
  os << "arena: " << arena_bytes_ << " bytes, " << order_.size() << " buffers, " << param_total_
     << " parameters in " << params_.size() << " tensors (real = " << real_size_ << " bytes)\n";
  std::vector<const Buffer*> all;
  for (const auto& n : order_) all.push_back(&buffers_.at(n));
  std::stable_sort(all.begin(), all.end(), [](const Buffer* a, const Buffer* b) { return a->offset_bytes < b->offset_bytes; });
  for (const Buffer* b : all) {
    os << "  " << b->offset_bytes << "\t" << b->bytes << "\t" << to_string(b->kind) << "\t" << to_string(b->dtype)
       << shape_text(b->shape) << "\t" << b->name;
    if (!b->view_of.empty()) os << "  (view of " << b->view_of << " @" << b->view_offset << ")";
    os << "  <" << b->owner << ">\n";
  }
  return os.str();
}

}  // namespace dqn
