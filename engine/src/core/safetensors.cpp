/** @file safetensors.cpp
 *  @brief safetensors reading (every offset, size and type checked before a byte is copied)
 *  and atomic writing (temporary file, fsync, rename).
 */
#include "core/safetensors.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <set>
#include <tuple>
#include <utility>

#include <nlohmann/json.hpp>

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; this reader copies bytes as they are");

namespace dqn::st {

namespace {

constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;  // the reference implementation's limit

struct DTypeInfo {
  DType dtype;
  const char* name;
  std::size_t size;
  int align_rank;  // position in the reference writer's dtype order (ascending alignment)
};

constexpr DTypeInfo kDTypes[] = {
    {DType::F64, "F64", 8, 12}, {DType::F32, "F32", 4, 11}, {DType::F16, "F16", 2, 7},
    {DType::BF16, "BF16", 2, 8}, {DType::I64, "I64", 8, 13}, {DType::I32, "I32", 4, 9},
    {DType::I16, "I16", 2, 5},  {DType::I8, "I8", 1, 2},     {DType::U8, "U8", 1, 1},
    {DType::BOOL, "BOOL", 1, 0},
};

const DTypeInfo& info(DType d) {
  for (const auto& i : kDTypes)
    if (i.dtype == d) return i;
  throw std::invalid_argument("safetensors: invalid DType value " +
                              std::to_string(static_cast<int>(d)));
}

std::string supported_dtypes() {
  std::string s;
  for (const auto& i : kDTypes) {
    if (!s.empty()) s += ", ";
    s += i.name;
  }
  return s;
}

std::string squote(const std::string& s) { return "'" + s + "'"; }

/// Non-ASCII and control bytes as \xNN, so a message about a broken header stays printable.
std::string printable(const std::string& s) {
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned char c : s) {
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

std::string errno_text(int err) { return std::strerror(err); }

/// numel * elem_size with overflow detection; nullopt on a negative dim or overflow.
std::optional<std::uint64_t> checked_nbytes(const std::vector<std::int64_t>& shape,
                                            std::size_t elem_size) {
  std::uint64_t n = 1;
  for (auto d : shape) {
    if (d < 0) return std::nullopt;
    if (__builtin_mul_overflow(n, static_cast<std::uint64_t>(d), &n)) return std::nullopt;
  }
  if (__builtin_mul_overflow(n, static_cast<std::uint64_t>(elem_size), &n)) return std::nullopt;
  return n;
}

/// "a number", "an array", ...: for messages.
std::string json_type(const nlohmann::json& j) {
  std::string t = j.type_name();
  return (t == "array" || t == "object" ? "an " : "a ") + t;
}

// ---------------------------------------------------------------------------------------------
// Reading

/// Rejects duplicate keys at any depth (nlohmann would silently keep the last one).
struct DuplicateKeyCheck {
  std::vector<std::set<std::string>> open_objects;
  std::optional<std::string> duplicate;

  bool operator()(int /*depth*/, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    using E = nlohmann::json::parse_event_t;
    if (event == E::object_start) {
      open_objects.emplace_back();
    } else if (event == E::object_end) {
      if (!open_objects.empty()) open_objects.pop_back();
    } else if (event == E::key && !open_objects.empty() && !duplicate) {
      const auto& key = parsed.get_ref<const std::string&>();
      if (!open_objects.back().insert(key).second) duplicate = key;
    }
    return true;
  }
};

struct Span {
  std::uint64_t begin, end;
  std::string name;
};

std::uint64_t read_u64_le(const std::uint8_t* p) {
  std::uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

/// A hint for files that are something else entirely.
std::string format_hint(const std::vector<std::uint8_t>& image) {
  if (image.size() >= 4 && image[0] == 'P' && image[1] == 'K' && image[2] == 3 && image[3] == 4)
    return " (the file is a zip archive, e.g. a PyTorch .pt checkpoint, not safetensors)";
  if (!image.empty() && (image[0] == '{' || image[0] == '['))
    return " (the file starts with JSON text; safetensors starts with an 8-byte length)";
  return "";
}

std::uint64_t json_offset(const nlohmann::json& v, bool& ok) {
  if (v.is_number_unsigned()) return v.get<std::uint64_t>();
  ok = false;  // negative integers, floats and everything else
  return 0;
}

Tensor parse_entry(const std::string& path, const std::string& name, const nlohmann::json& e,
                   std::uint64_t& begin, std::uint64_t& end) {
  auto fail = [&](const std::string& why) -> Error {
    return Error(path, "tensor " + squote(name) + ": " + why);
  };
  if (!e.is_object())
    throw fail(std::string("header entry is ") + json_type(e) +
               ", expected an object with \"dtype\", \"shape\", \"data_offsets\"");
  for (const char* key : {"dtype", "shape", "data_offsets"})
    if (!e.contains(key)) throw fail(std::string("missing \"") + key + "\"");

  const auto& jd = e["dtype"];
  if (!jd.is_string())
    throw fail(std::string("\"dtype\" is ") + json_type(jd) + ", expected a string");
  const auto& dname = jd.get_ref<const std::string&>();
  auto dtype = dtype_from_name(dname);
  if (!dtype)
    throw fail("unknown dtype " + squote(dname) + " (supported: " + supported_dtypes() + ")");

  const auto& js = e["shape"];
  if (!js.is_array())
    throw fail(std::string("\"shape\" is ") + json_type(js) + ", expected an array of integers");
  Tensor t;
  t.dtype = *dtype;
  for (std::size_t i = 0; i < js.size(); ++i) {
    const auto& d = js[i];
    if (d.is_number_unsigned()) {
      auto u = d.get<std::uint64_t>();
      if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
        throw fail("shape " + js.dump() + " has a dimension too large");
      t.shape.push_back(static_cast<std::int64_t>(u));
    } else if (d.is_number_integer()) {
      throw fail("shape " + js.dump() + " has a negative dimension");
    } else {
      throw fail("shape " + js.dump() + ": element " + std::to_string(i) + " is " +
                 json_type(d) + ", expected a non-negative integer");
    }
  }
  auto nbytes = checked_nbytes(t.shape, dtype_size(t.dtype));
  if (!nbytes) throw fail("shape " + js.dump() + " overflows 64-bit byte counts");

  const auto& jo = e["data_offsets"];
  bool ok = jo.is_array() && jo.size() == 2;
  if (ok) {
    begin = json_offset(jo[0], ok);
    end = json_offset(jo[1], ok);
  }
  if (!ok)
    throw fail("\"data_offsets\" is " + jo.dump() +
               ", expected [begin, end] with non-negative integers");
  if (end < begin) throw fail("data_offsets " + jo.dump() + " end before they begin");
  if (end - begin != *nbytes)
    throw fail("data_offsets " + jo.dump() + " span " + std::to_string(end - begin) +
               " bytes, but shape " + shape_str(t.shape) + " of " + dtype_name(t.dtype) +
               " needs " + std::to_string(*nbytes));
  return t;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Small helpers

std::size_t dtype_size(DType d) { return info(d).size; }
const char* dtype_name(DType d) { return info(d).name; }

std::optional<DType> dtype_from_name(std::string_view name) {
  for (const auto& i : kDTypes)
    if (name == i.name) return i.dtype;
  return std::nullopt;
}

float f16_to_f32(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  const std::uint32_t mant = h & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: mant * 2^-24, exact in float
    float v = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -v : v;
  }
  std::uint32_t bits;
  if (exp == 0x1f)
    bits = sign | 0x7f800000u | (mant << 13);  // inf, or NaN with its payload kept
  else
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  return std::bit_cast<float>(bits);
}

float bf16_to_f32(std::uint16_t b) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16);
}

std::string shape_str(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ",";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

std::int64_t Tensor::numel() const {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

Error::Error(std::string path, std::string reason)
    : std::runtime_error(path.empty() ? "safetensors: " + reason
                                      : "safetensors file '" + path + "': " + reason),
      path_(std::move(path)),
      reason_(std::move(reason)) {}

// ---------------------------------------------------------------------------------------------
// File

void File::put(const std::string& name, Tensor t) {
  auto fail = [&](const std::string& why) { return Error(path, "put " + squote(name) + ": " + why); };
  if (name.empty()) throw fail("tensor names must not be empty");
  if (name == "__metadata__") throw fail("the name is reserved for the header's metadata");
  auto nbytes = checked_nbytes(t.shape, dtype_size(t.dtype));
  if (!nbytes) throw fail("shape " + shape_str(t.shape) + " has a negative dimension or overflows");
  if (t.bytes.size() != *nbytes)
    throw fail("has " + std::to_string(t.bytes.size()) + " bytes, but shape " +
               shape_str(t.shape) + " of " + dtype_name(t.dtype) + " needs " +
               std::to_string(*nbytes));
  tensors[name] = std::move(t);
}

namespace {
template <typename T>
Tensor make_tensor(const std::string& path, const std::string& name, DType dtype,
                   std::vector<std::int64_t> shape, const T* data) {
  auto nbytes = checked_nbytes(shape, sizeof(T));
  if (!nbytes)
    throw Error(path, "put " + squote(name) + ": shape " + shape_str(shape) +
                          " has a negative dimension or overflows");
  if (*nbytes > 0 && data == nullptr)
    throw Error(path, "put " + squote(name) + ": null data for shape " + shape_str(shape));
  Tensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.bytes.resize(*nbytes);
  if (*nbytes > 0) std::memcpy(t.bytes.data(), data, *nbytes);
  return t;
}
}  // namespace

void File::put_f32(const std::string& name, std::vector<std::int64_t> shape, const float* data) {
  put(name, make_tensor(path, name, DType::F32, std::move(shape), data));
}
void File::put_i32(const std::string& name, std::vector<std::int64_t> shape,
                   const std::int32_t* data) {
  put(name, make_tensor(path, name, DType::I32, std::move(shape), data));
}
void File::put_i64(const std::string& name, std::vector<std::int64_t> shape,
                   const std::int64_t* data) {
  put(name, make_tensor(path, name, DType::I64, std::move(shape), data));
}

void File::put_raw(const std::string& name, DType dtype, std::vector<std::int64_t> shape, const void* data) {
  Tensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  const auto nbytes = checked_nbytes(t.shape, dtype_size(dtype));
  if (!nbytes) throw Error(path, "put " + squote(name) + ": shape " + shape_str(t.shape) + " has a negative dimension or overflows");
  const auto* p = static_cast<const std::uint8_t*>(data);
  if (*nbytes) t.bytes.assign(p, p + *nbytes);
  put(name, std::move(t));
}

void File::get_raw(const std::string& name, DType dtype, const std::vector<std::int64_t>& shape, void* out) const {
  const Tensor& t = get(name);
  if (t.dtype != dtype || t.shape != shape)
    throw Error(path, "tensor " + squote(name) + " is " + dtype_name(t.dtype) + " " + shape_str(t.shape) + ", expected " +
                          dtype_name(dtype) + " " + shape_str(shape));
  if (!t.bytes.empty()) std::memcpy(out, t.bytes.data(), t.bytes.size());
}

bool File::has(const std::string& name) const { return tensors.count(name) != 0; }

const Tensor& File::get(const std::string& name) const {
  auto it = tensors.find(name);
  if (it != tensors.end()) return it->second;
  // List the names that share the longest prefix with the one asked for first.
  std::vector<std::pair<std::size_t, std::string>> ranked;
  for (const auto& [n, t] : tensors) {
    auto mm = std::mismatch(n.begin(), n.end(), name.begin(), name.end());
    ranked.emplace_back(static_cast<std::size_t>(mm.first - n.begin()), n);
  }
  std::stable_sort(ranked.begin(), ranked.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  constexpr std::size_t kShown = 8;
  std::string msg = "no tensor named " + squote(name);
  if (ranked.empty()) {
    msg += "; the file has no tensors";
  } else {
    msg += "; it has " + std::to_string(ranked.size()) + " tensors, e.g. ";
    for (std::size_t i = 0; i < std::min(kShown, ranked.size()); ++i)
      msg += (i ? ", " : "") + ranked[i].second;
    if (ranked.size() > kShown) msg += ", ...";
  }
  throw Error(path, msg);
}

const Tensor& File::get_checked(const std::string& name,
                                const std::vector<std::int64_t>& expect_shape) const {
  const Tensor& t = get(name);
  if (!expect_shape.empty() && t.shape != expect_shape)
    throw Error(path, "tensor " + squote(name) + " has shape " + shape_str(t.shape) +
                          ", expected " + shape_str(expect_shape));
  return t;
}

namespace {
template <typename T>
std::vector<T> copy_elements(const Tensor& t) {
  std::vector<T> out(t.bytes.size() / sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), t.bytes.data(), out.size() * sizeof(T));
  return out;
}
}  // namespace

std::vector<float> File::get_f32(const std::string& name,
                                 const std::vector<std::int64_t>& expect_shape) const {
  const Tensor& t = get_checked(name, expect_shape);
  switch (t.dtype) {
    case DType::F32:
      return copy_elements<float>(t);
    case DType::F64: {
      auto d = copy_elements<double>(t);
      std::vector<float> out(d.size());
      for (std::size_t i = 0; i < d.size(); ++i) {
        if (std::isfinite(d[i]) && std::fabs(d[i]) > std::numeric_limits<float>::max())
          throw Error(path, "tensor " + squote(name) + " (F64) element " + std::to_string(i) +
                                " is " + std::to_string(d[i]) + ", outside the f32 range");
        out[i] = static_cast<float>(d[i]);
      }
      return out;
    }
    case DType::F16:
    case DType::BF16: {
      auto h = copy_elements<std::uint16_t>(t);
      std::vector<float> out(h.size());
      for (std::size_t i = 0; i < h.size(); ++i)
        out[i] = t.dtype == DType::F16 ? f16_to_f32(h[i]) : bf16_to_f32(h[i]);
      return out;
    }
    default:
      throw Error(path, "tensor " + squote(name) + " is " + dtype_name(t.dtype) +
                            ", expected a float dtype (F64, F32, BF16, F16)");
  }
}

std::vector<std::int32_t> File::get_i32(const std::string& name,
                                        const std::vector<std::int64_t>& expect_shape) const {
  const Tensor& t = get_checked(name, expect_shape);
  if (t.dtype == DType::I32) return copy_elements<std::int32_t>(t);
  if (t.dtype != DType::I64)
    throw Error(path, "tensor " + squote(name) + " is " + dtype_name(t.dtype) +
                          ", expected I32 or I64");
  auto wide = copy_elements<std::int64_t>(t);
  std::vector<std::int32_t> out(wide.size());
  for (std::size_t i = 0; i < wide.size(); ++i) {
    if (wide[i] < std::numeric_limits<std::int32_t>::min() ||
        wide[i] > std::numeric_limits<std::int32_t>::max())
      throw Error(path, "tensor " + squote(name) + " (I64) element " + std::to_string(i) + " is " +
                            std::to_string(wide[i]) + ", outside the i32 range");
    out[i] = static_cast<std::int32_t>(wide[i]);
  }
  return out;
}

std::vector<std::int64_t> File::get_i64(const std::string& name,
                                        const std::vector<std::int64_t>& expect_shape) const {
  const Tensor& t = get_checked(name, expect_shape);
  if (t.dtype == DType::I64) return copy_elements<std::int64_t>(t);
  if (t.dtype != DType::I32)
    throw Error(path, "tensor " + squote(name) + " is " + dtype_name(t.dtype) +
                          ", expected I64 or I32");
  auto narrow = copy_elements<std::int32_t>(t);
  return std::vector<std::int64_t>(narrow.begin(), narrow.end());
}

namespace {
void check_scalar(const File& f, const std::string& name) {
  const Tensor& t = f.get(name);
  if (!(t.shape.empty() || t.shape == std::vector<std::int64_t>{1}))
    throw Error(f.path, "tensor " + squote(name) + " has shape " + shape_str(t.shape) +
                            ", expected a scalar ([] or [1])");
}
}  // namespace

std::int64_t File::get_scalar_i64(const std::string& name) const {
  check_scalar(*this, name);
  return get_i64(name).at(0);
}

float File::get_scalar_f32(const std::string& name) const {
  check_scalar(*this, name);
  return get_f32(name).at(0);
}

std::vector<std::string> File::names() const {
  std::vector<std::string> out;
  out.reserve(tensors.size());
  for (const auto& [n, t] : tensors) out.push_back(n);
  return out;
}

// ---------------------------------------------------------------------------------------------
// Parsing

File parse(const std::vector<std::uint8_t>& image, const std::string& path) {
  auto fail = [&](const std::string& why) { return Error(path, why); };
  const std::uint64_t file_bytes = image.size();
  if (file_bytes < 8)
    throw fail("file is " + std::to_string(file_bytes) +
               " bytes, shorter than the 8-byte header length" + format_hint(image));
  const std::uint64_t n = read_u64_le(image.data());
  if (n > kMaxHeaderBytes)
    throw fail("header length " + std::to_string(n) + " is absurd (limit " +
               std::to_string(kMaxHeaderBytes) + " bytes): not a safetensors file" +
               format_hint(image));
  if (n > file_bytes - 8)
    throw fail("header length " + std::to_string(n) + " is larger than the file (" +
               std::to_string(file_bytes - 8) + " bytes after the 8-byte length): truncated?");
  const auto* hdr = reinterpret_cast<const char*>(image.data() + 8);
  if (n == 0) throw fail("header is empty, expected a JSON object");

  // nlohmann stops at a NUL as if the input ended; the reference reader rejects it.
  if (const void* nul = std::memchr(hdr, '\0', n))
    throw fail("header has a NUL byte at offset " +
               std::to_string(static_cast<const char*>(nul) - hdr) +
               " (headers are padded with spaces, not NULs)");
  nlohmann::json header;
  DuplicateKeyCheck dup;
  try {
    header = nlohmann::json::parse(hdr, hdr + n, std::ref(dup));
  } catch (const nlohmann::json::parse_error& e) {
    std::string what = e.what();
    auto pos = what.find("] ");
    if (pos != std::string::npos) what = what.substr(pos + 2);
    what = printable(what);  // the parser quotes the offending bytes, which may not be UTF-8
    throw fail("header is not valid JSON (byte " + std::to_string(e.byte) + " of the header): " +
               what);
  }
  if (dup.duplicate) throw fail("header repeats the key " + squote(*dup.duplicate));
  if (!header.is_object())
    throw fail(std::string("header is ") + json_type(header) + ", expected a JSON object");

  File f;
  f.path = path;
  std::vector<Span> spans;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (entry.is_null()) continue;
      if (!entry.is_object())
        throw fail(std::string("\"__metadata__\" is ") + json_type(entry) +
                   ", expected an object of strings");
      for (const auto& [k, v] : entry.items()) {
        if (!v.is_string())
          throw fail("\"__metadata__\" key " + squote(k) + " is " + json_type(v) +
                     ", expected a string");
        f.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    std::uint64_t begin = 0, end = 0;
    Tensor t = parse_entry(path, name, entry, begin, end);
    spans.push_back({begin, end, name});
    f.tensors.emplace(name, std::move(t));
  }

  // The data section must be covered exactly: sorted by offset, each tensor starts where the
  // previous one ended, and the last ends at the end of the file.
  const std::uint64_t data_bytes = file_bytes - 8 - n;
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  auto range = [](const Span& s) {
    return "[" + std::to_string(s.begin) + "," + std::to_string(s.end) + ")";
  };
  for (const auto& s : spans)
    if (s.end > data_bytes)
      throw fail("truncated: tensor " + squote(s.name) + " needs bytes " + range(s) +
                 " but the data section has " + std::to_string(data_bytes));
  std::uint64_t covered = 0;
  for (std::size_t i = 0; i < spans.size(); ++i) {
    const Span& s = spans[i];
    if (s.begin < covered)
      throw fail("tensors " + squote(spans[i - 1].name) + " " + range(spans[i - 1]) + " and " +
                 squote(s.name) + " " + range(s) + " overlap");
    if (s.begin > covered)
      throw fail("bytes [" + std::to_string(covered) + "," + std::to_string(s.begin) +
                 ") of the data section belong to no tensor (gap before " + squote(s.name) + ")");
    covered = s.end;
  }
  if (covered != data_bytes)
    throw fail("the data section has " + std::to_string(data_bytes) + " bytes but the tensors " +
               "cover only " + std::to_string(covered) + " (" + std::to_string(data_bytes - covered) +
               " trailing bytes; safetensors requires exact coverage)");

  const std::uint8_t* data = image.data() + 8 + n;
  for (const auto& s : spans)
    f.tensors[s.name].bytes.assign(data + s.begin, data + s.end);
  return f;
}

File read_file(const std::string& path) {
  // O_NONBLOCK: a FIFO would block the open until a writer came; it is refused below instead.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw Error(path, "cannot open: " + errno_text(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw Error(path, "cannot stat: " + errno_text(errno));
  if (!S_ISREG(st.st_mode)) throw Error(path, "not a regular file");
  std::vector<std::uint8_t> image(static_cast<std::size_t>(st.st_size));
  std::size_t got = 0;
  while (got < image.size()) {
    ssize_t r = ::read(fd, image.data() + got, image.size() - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) throw Error(path, "cannot read: " + errno_text(errno));
    if (r == 0) break;  // shrank while reading: parse what is there
    got += static_cast<std::size_t>(r);
  }
  image.resize(got);
  return parse(image, path);
}

// ---------------------------------------------------------------------------------------------
// Writing

namespace {

struct Prepared {
  std::string header;  // padded JSON
  std::vector<const std::pair<const std::string, Tensor>*> order;
  std::uint64_t data_bytes = 0;
};

Prepared prepare(const File& f, const std::string& path) {
  Prepared p;
  for (const auto& entry : f.tensors) {
    const auto& [name, t] = entry;
    if (name.empty() || name == "__metadata__")
      throw Error(path, "cannot write a tensor named " + squote(name));
    auto nbytes = checked_nbytes(t.shape, dtype_size(t.dtype));
    if (!nbytes || *nbytes != t.bytes.size())
      throw Error(path, "cannot write tensor " + squote(name) + ": it has " +
                            std::to_string(t.bytes.size()) + " bytes, but shape " +
                            shape_str(t.shape) + " of " + dtype_name(t.dtype) + " needs " +
                            (nbytes ? std::to_string(*nbytes) : std::string("an invalid size")));
    p.order.push_back(&entry);
  }
  // Descending alignment, then name: every tensor's data then starts at a multiple of its
  // element size, since the header is padded to 8 bytes.
  std::stable_sort(p.order.begin(), p.order.end(), [](const auto* a, const auto* b) {
    int ra = info(a->second.dtype).align_rank, rb = info(b->second.dtype).align_rank;
    if (ra != rb) return ra > rb;
    return a->first < b->first;
  });

  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!f.metadata.empty()) {
    auto& m = h["__metadata__"];
    m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : f.metadata) m[k] = v;
  }
  for (const auto* e : p.order) {
    const Tensor& t = e->second;
    nlohmann::ordered_json entry = nlohmann::ordered_json::object();
    entry["dtype"] = dtype_name(t.dtype);
    entry["shape"] = t.shape;
    entry["data_offsets"] = {p.data_bytes, p.data_bytes + t.bytes.size()};
    p.data_bytes += t.bytes.size();
    h[e->first] = std::move(entry);
  }
  try {
    p.header = h.dump();
  } catch (const nlohmann::json::type_error& e) {
    throw Error(path, std::string("cannot write: a tensor name or metadata string is not valid "
                                  "UTF-8 (") + e.what() + ")");
  }
  p.header.append((8 - p.header.size() % 8) % 8, ' ');
  return p;
}

std::string length_prefix(std::uint64_t n) {
  std::string s(8, '\0');
  std::memcpy(s.data(), &n, 8);
  return s;
}

bool write_all(int fd, const void* data, std::size_t size) {
  const auto* p = static_cast<const std::uint8_t*>(data);
  while (size > 0) {
    ssize_t w = ::write(fd, p, size);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return false;
    p += w;
    size -= static_cast<std::size_t>(w);
  }
  return true;
}

std::string parent_dir(const std::string& path) {
  auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

}  // namespace

std::vector<std::uint8_t> serialize(const File& f, const std::string& path_for_errors) {
  Prepared p = prepare(f, path_for_errors);
  std::vector<std::uint8_t> out;
  out.reserve(8 + p.header.size() + p.data_bytes);
  auto prefix = length_prefix(p.header.size());
  out.insert(out.end(), prefix.begin(), prefix.end());
  out.insert(out.end(), p.header.begin(), p.header.end());
  for (const auto* e : p.order) out.insert(out.end(), e->second.bytes.begin(), e->second.bytes.end());
  return out;
}

namespace {
/// Writes the pieces one after the other into path, atomically (temporary file, fsync, rename,
/// fsync of the folder); on a failure the temporary is removed and an existing file is untouched.
void write_atomic(const std::string& path, const std::vector<std::pair<const void*, std::size_t>>& pieces) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0666);
  if (fd < 0) throw Error(path, "cannot create temporary file '" + tmp + "': " + errno_text(errno));

  auto abandon = [&](const std::string& step, int err) {
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    return Error(path, step + " '" + tmp + "': " + errno_text(err) +
                           "; the existing file, if any, is untouched");
  };
  bool ok = true;
  for (std::size_t i = 0; ok && i < pieces.size(); ++i) ok = write_all(fd, pieces[i].first, pieces[i].second);
  if (!ok) throw abandon("cannot write", errno);
  if (::fsync(fd) != 0) throw abandon("cannot fsync", errno);
  int rc = ::close(fd);
  fd = -1;
  if (rc != 0) throw abandon("cannot close", errno);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    throw Error(path, "cannot rename '" + tmp + "' over it: " + errno_text(err) +
                          "; the existing file, if any, is untouched");
  }
  // Make the rename itself durable; a failure here leaves a complete file, so it is not fatal.
  int dfd = ::open(parent_dir(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    (void)::fsync(dfd);
    ::close(dfd);
  }
}
}  // namespace

void write_file(const std::string& path, const File& f) {
  Prepared p = prepare(f, path);  // every validation happens before the disk is touched
  const std::string prefix = length_prefix(p.header.size());
  std::vector<std::pair<const void*, std::size_t>> pieces{{prefix.data(), prefix.size()},
                                                          {p.header.data(), p.header.size()}};
  for (const auto* e : p.order) pieces.emplace_back(e->second.bytes.data(), e->second.bytes.size());
  write_atomic(path, pieces);
}

void write_bytes(const std::string& path, const std::string& bytes) { write_atomic(path, {{bytes.data(), bytes.size()}}); }

}  // namespace dqn::st
