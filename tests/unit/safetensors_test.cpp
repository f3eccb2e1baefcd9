// Unit tests of the safetensors reader/writer: round trips, exact bytes, every rejected
// corruption with its message, atomic writes, dtype conversion, and tools/st_check.py.
#include <doctest/doctest.h>

#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "dqn_config.h"
#include "core/safetensors.hpp"

namespace fs = std::filesystem;
using dqn::st::DType;
using dqn::st::Error;
using dqn::st::File;
using dqn::st::Tensor;

namespace {

/// A fresh directory under /tmp, removed with everything in it at scope exit.
struct TempDir {
  fs::path dir;
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "dqn_st_test.XXXXXX").string();
    REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
    dir = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::permissions(dir, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(dir, ec);
  }
  std::string operator/(const std::string& name) const { return (dir / name).string(); }
};

std::vector<std::uint8_t> slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in.good());
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void spit(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out.good());
}

std::string u64_le(std::uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return s;
}

/// A file image: the length prefix, the header exactly as given, then data_bytes bytes.
std::string image(const std::string& header, std::size_t data_bytes = 0) {
  return u64_le(header.size()) + header + std::string(data_bytes, '\x11');
}

std::string bytes_str(const std::vector<std::uint8_t>& v) { return std::string(v.begin(), v.end()); }

/// Runs f, which must throw Error; returns the message after checking it names the path.
template <typename F>
std::string error_of(const std::string& path, F&& f) {
  try {
    f();
  } catch (const Error& e) {
    std::string what = e.what();
    CHECK_MESSAGE(what.find(path) != std::string::npos, "message lacks the path: " << what);
    CHECK(e.path() == path);
    return what;
  }
  FAIL_CHECK("no dqn::st::Error thrown");
  return "";
}

Tensor patterned(DType dtype, std::vector<std::int64_t> shape, int seed) {
  Tensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.bytes.resize(static_cast<std::size_t>(t.numel()) * dqn::st::dtype_size(dtype));
  for (std::size_t i = 0; i < t.bytes.size(); ++i)
    t.bytes[i] = static_cast<std::uint8_t>((i * 37 + static_cast<std::size_t>(seed) * 11 + 5) & 0xff);
  if (dtype == DType::BOOL)
    for (auto& b : t.bytes) b &= 1;
  return t;
}

std::string from_hex(const char* hex) {
  std::string out;
  for (std::size_t i = 0; hex[i] && hex[i + 1]; i += 2)
    out += static_cast<char>(std::stoi(std::string(hex + i, 2), nullptr, 16));
  return out;
}

const DType kAllDTypes[] = {DType::F64, DType::F32, DType::F16, DType::BF16, DType::I64,
                            DType::I32, DType::I16, DType::I8,  DType::U8,   DType::BOOL};

}  // namespace

TEST_CASE("safetensors.dtype_table") {
  struct Row {
    DType d;
    const char* name;
    std::size_t size;
  };
  const Row rows[] = {{DType::F64, "F64", 8}, {DType::F32, "F32", 4}, {DType::F16, "F16", 2},
                      {DType::BF16, "BF16", 2}, {DType::I64, "I64", 8}, {DType::I32, "I32", 4},
                      {DType::I16, "I16", 2}, {DType::I8, "I8", 1},   {DType::U8, "U8", 1},
                      {DType::BOOL, "BOOL", 1}};
  for (const auto& r : rows) {
    CAPTURE(r.name);
    CHECK(std::string(dqn::st::dtype_name(r.d)) == r.name);
    CHECK(dqn::st::dtype_size(r.d) == r.size);
    CHECK(dqn::st::dtype_from_name(r.name) == r.d);
  }
  CHECK_FALSE(dqn::st::dtype_from_name("F8_E4M3").has_value());
  CHECK_FALSE(dqn::st::dtype_from_name("f32").has_value());
  CHECK(dqn::st::shape_str({}) == "[]");
  CHECK(dqn::st::shape_str({3, 4}) == "[3,4]");
  Tensor scalar;
  CHECK(scalar.numel() == 1);
  scalar.shape = {3, 0, 2};
  CHECK(scalar.numel() == 0);
}

TEST_CASE("safetensors.roundtrip") {
  TempDir tmp;
  File f;
  int seed = 0;
  for (DType d : kAllDTypes) {
    std::string n = dqn::st::dtype_name(d);
    f.put("m." + n, patterned(d, {2, 3}, seed++));
    f.put("scalar." + n, patterned(d, {}, seed++));
    f.put("empty." + n, patterned(d, {0}, seed++));
    f.put("empty3d." + n, patterned(d, {3, 0, 2}, seed++));
    f.put("odd." + n, patterned(d, {1, 5, 1, 3}, seed++));
  }
  f.metadata["format"] = "dqn";
  f.metadata["note"] = "ünïcode ✓ \"quoted\" \\ back\nslash";
  f.metadata["empty"] = "";
  const std::string path = tmp / "all.safetensors";
  dqn::st::write_file(path, f);

  File g = dqn::st::read_file(path);
  CHECK(g.path == path);
  CHECK(g.metadata == f.metadata);
  REQUIRE(g.names() == f.names());
  for (const auto& [name, t] : f.tensors) {
    CAPTURE(name);
    const Tensor& u = g.get(name);
    CHECK(u.dtype == t.dtype);
    CHECK(u.shape == t.shape);
    CHECK(u.bytes == t.bytes);
  }
  // Writing what was read gives the same bytes: the layout is deterministic.
  const std::string again = tmp / "again.safetensors";
  dqn::st::write_file(again, g);
  CHECK(slurp(again) == slurp(path));
  CHECK(dqn::st::serialize(g) == slurp(path));

  // Each tensor's data starts at a multiple of its element size within the file.
  auto img = slurp(path);
  std::uint64_t n = 0;
  std::memcpy(&n, img.data(), 8);
  CHECK(n % 8 == 0);
  auto header = nlohmann::json::parse(img.begin() + 8, img.begin() + 8 + static_cast<long>(n));
  for (const auto& [name, e] : header.items()) {
    if (name == "__metadata__") continue;
    auto size = dqn::st::dtype_size(*dqn::st::dtype_from_name(e["dtype"].get<std::string>()));
    CHECK_MESSAGE((8 + n + e["data_offsets"][0].get<std::uint64_t>()) % size == 0, name);
  }

  // A file with no tensors and no metadata.
  File none;
  dqn::st::write_file(tmp / "none.st", none);
  File none_back = dqn::st::read_file(tmp / "none.st");
  CHECK(none_back.tensors.empty());
  CHECK(none_back.metadata.empty());
}

TEST_CASE("safetensors.put_and_typed_get") {
  File f;
  const float w[6] = {1.5f, -2.0f, 0.0f, 3.25f, -0.125f, 1e-30f};
  const std::int32_t a[4] = {0, -1, 2147483647, -2147483647 - 1};
  const std::int64_t step = 12345678901234LL;
  f.put_f32("w", {2, 3}, w);
  f.put_i32("actions", {2, 2}, a);
  f.put_i64("adam.step", {}, &step);
  f.put_f32("none", {0, 4}, nullptr);

  CHECK(f.get_f32("w", {2, 3}) == std::vector<float>(w, w + 6));
  CHECK(f.get_f32("w").size() == 6);
  CHECK(f.get_i32("actions", {2, 2}) == std::vector<std::int32_t>(a, a + 4));
  CHECK(f.get_i64("actions") == std::vector<std::int64_t>(a, a + 4));
  CHECK(f.get_i64("adam.step") == std::vector<std::int64_t>{step});
  CHECK(f.get_scalar_i64("adam.step") == step);
  CHECK(f.get_f32("none", {0, 4}).empty());
  CHECK(f.has("w"));
  CHECK_FALSE(f.has("W"));

  // put replaces.
  const float w2[2] = {7.0f, 8.0f};
  f.put_f32("w", {2}, w2);
  CHECK(f.get_f32("w") == std::vector<float>{7.0f, 8.0f});
  CHECK(f.tensors.size() == 4);

  // I64 holding values that fit is readable as i32; one that does not fit is named.
  const std::int64_t wide[3] = {5, -7, 5000000000LL};
  f.put_i64("wide", {3}, wide);
  f.put_i64("narrowable", {2}, wide);
  CHECK(f.get_i32("narrowable") == std::vector<std::int32_t>{5, -7});
  struct Case {
    const char* why;
    std::function<void()> call;
    const char* reason;
  };
  const float one = 1.0f;
  const Case cases[] = {
      {"i64 out of i32 range", [&] { (void)f.get_i32("wide"); },
       "tensor 'wide' (I64) element 2 is 5000000000, outside the i32 range"},
      {"shape differs", [&] { (void)f.get_f32("w", {4, 4}); }, "tensor 'w' has shape [2], expected [4,4]"},
      {"float getter on ints", [&] { (void)f.get_f32("actions"); },
       "tensor 'actions' is I32, expected a float dtype"},
      {"int getter on floats", [&] { (void)f.get_i32("w"); }, "tensor 'w' is F32, expected I32 or I64"},
      {"i64 getter on floats", [&] { (void)f.get_i64("w"); }, "tensor 'w' is F32, expected I64 or I32"},
      {"scalar getter on a vector", [&] { (void)f.get_scalar_i64("wide"); },
       "tensor 'wide' has shape [3], expected a scalar"},
      {"missing tensor", [&] { (void)f.get("adam.stpe"); }, "no tensor named 'adam.stpe'"},
      {"bytes do not match shape",
       [&] { f.put("bad", Tensor{DType::F32, {2, 2}, std::vector<std::uint8_t>(12)}); },
       "put 'bad': has 12 bytes, but shape [2,2] of F32 needs 16"},
      {"negative dimension", [&] { f.put_f32("neg", {2, -1}, &one); }, "shape [2,-1] has a negative dimension"},
      {"reserved name", [&] { f.put_f32("__metadata__", {1}, &one); }, "reserved"},
      {"empty name", [&] { f.put_f32("", {1}, &one); }, "must not be empty"},
      {"null data", [&] { f.put_f32("nul", {1}, nullptr); }, "null data for shape [1]"},
  };
  for (const auto& c : cases) {
    const std::string why = c.why;
    CAPTURE(why);
    std::string what = error_of("", c.call);
    CHECK_MESSAGE(what.find(c.reason) != std::string::npos, what);
  }
  CHECK_FALSE(f.has("bad"));

  // The missing-tensor message lists the closest names first.
  File many;
  for (int i = 0; i < 20; ++i) many.put_f32("layer" + std::to_string(i) + ".bias", {1}, &one);
  many.put_f32("adam.step_size", {1}, &one);
  std::string what = error_of("", [&] { (void)many.get("adam.step"); });
  CHECK_MESSAGE(what.find("it has 21 tensors, e.g. adam.step_size, ") != std::string::npos, what);
  CHECK(what.find(", ...") != std::string::npos);
  CHECK(error_of("", [&] { (void)File{}.get("x"); }).find("the file has no tensors") != std::string::npos);
}

TEST_CASE("safetensors.byte_exact") {
  SUBCASE("empty file, as the reference writer produces it") {
    CHECK(bytes_str(dqn::st::serialize(File{})) == u64_le(8) + "{}      ");
  }
  SUBCASE("metadata only") {
    File f;
    f.metadata["framework"] = "pt";
    CHECK(bytes_str(dqn::st::serialize(f)) == u64_le(40) + "{\"__metadata__\":{\"framework\":\"pt\"}}     ");
  }
  SUBCASE("one F32 tensor, header needing no padding") {
    File f;
    const float v[6] = {0, 1, 2, 3, 4, 5};
    f.put_f32("attn.0", {1, 2, 3}, v);
    const std::string expect =
        u64_le(64) + "{\"attn.0\":{\"dtype\":\"F32\",\"shape\":[1,2,3],\"data_offsets\":[0,24]}}" +
        std::string("\x00\x00\x00\x00" "\x00\x00\x80\x3f" "\x00\x00\x00\x40"
                    "\x00\x00\x40\x40" "\x00\x00\x80\x40" "\x00\x00\xa0\x40", 24);
    CHECK(bytes_str(dqn::st::serialize(f)) == expect);
  }
  SUBCASE("mixed dtypes: descending alignment then name, metadata first, 5 spaces of padding") {
    File f;
    f.put("b", Tensor{DType::I8, {3}, {1, 2, 3}});
    const float a[2] = {1.0f, -2.0f};
    f.put_f32("a", {2}, a);
    const std::int64_t c = 7;
    f.put_i64("c", {}, &c);
    const double d = 0.5;
    Tensor td{DType::F64, {1}, std::vector<std::uint8_t>(8)};
    std::memcpy(td.bytes.data(), &d, 8);
    f.put("d", td);
    f.metadata["step"] = "0";
    f.metadata["format"] = "dqn";
    const std::string header =
        "{\"__metadata__\":{\"format\":\"dqn\",\"step\":\"0\"},"
        "\"c\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[0,8]},"
        "\"d\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[8,16]},"
        "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[16,24]},"
        "\"b\":{\"dtype\":\"I8\",\"shape\":[3],\"data_offsets\":[24,27]}}"
        "     ";
    REQUIRE(header.size() == 264);
    const std::string data("\x07\x00\x00\x00\x00\x00\x00\x00"   // c = 7
                           "\x00\x00\x00\x00\x00\x00\xe0\x3f"   // d = 0.5
                           "\x00\x00\x80\x3f\x00\x00\x00\xc0"   // a = 1, -2
                           "\x01\x02\x03",                      // b
                           27);
    const std::string expect = std::string("\x08\x01\x00\x00\x00\x00\x00\x00", 8) + header + data;
    CHECK(bytes_str(dqn::st::serialize(f)) == expect);

    TempDir tmp;
    dqn::st::write_file(tmp / "mixed.st", f);
    CHECK(bytes_str(slurp(tmp / "mixed.st")) == expect);
    // And the hand-built bytes read back as the same tensors.
    spit(tmp / "hand.st", expect);
    File g = dqn::st::read_file(tmp / "hand.st");
    CHECK(g.get_scalar_i64("c") == 7);
    CHECK(g.get_f32("d") == std::vector<float>{0.5f});
    CHECK(g.get_f32("a") == std::vector<float>{1.0f, -2.0f});
    CHECK(g.get("b").bytes == std::vector<std::uint8_t>{1, 2, 3});
    CHECK(g.metadata.at("format") == "dqn");
  }
}

// Files written by the reference implementation (Python safetensors 0.8.0), captured as hex.
TEST_CASE("safetensors.reference_written_files") {
  TempDir tmp;
  SUBCASE("safetensors.numpy.save_file: eight dtypes, a scalar, an empty tensor, metadata") {
    // save_file({"w": arange(6, f32).reshape(2,3), "h": f16 [1,-2,65504], "i": i32 [[1,-2]],
    //            "l": i64 scalar 7, "b": bool [T,F], "u": arange(5, u8), "e": zeros((0,3), f64),
    //            "s": i16 [-3,4]}, metadata={"format": "np", "k": "v"})
    const std::string bytes = from_hex(
        "e0010000000000007b225f5f6d657461646174615f5f223a7b226b223a2276222c22666f726d6174223a226e70227d2c"
        "226c223a7b226474797065223a22493634222c227368617065223a5b5d2c22646174615f6f666673657473223a5b302c"
        "385d7d2c2265223a7b226474797065223a22463634222c227368617065223a5b302c335d2c22646174615f6f66667365"
        "7473223a5b382c385d7d2c2277223a7b226474797065223a22463332222c227368617065223a5b322c335d2c22646174"
        "615f6f666673657473223a5b382c33325d7d2c2269223a7b226474797065223a22493332222c227368617065223a5b31"
        "2c325d2c22646174615f6f666673657473223a5b33322c34305d7d2c2268223a7b226474797065223a22463136222c22"
        "7368617065223a5b335d2c22646174615f6f666673657473223a5b34302c34365d7d2c2273223a7b226474797065223a"
        "22493136222c227368617065223a5b325d2c22646174615f6f666673657473223a5b34362c35305d7d2c2275223a7b22"
        "6474797065223a225538222c227368617065223a5b355d2c22646174615f6f666673657473223a5b35302c35355d7d2c"
        "2262223a7b226474797065223a22424f4f4c222c227368617065223a5b325d2c22646174615f6f666673657473223a5b"
        "35352c35375d7d7d0700000000000000000000000000803f0000004000004040000080400000a04001000000feffffff"
        "003c00c0ff7bfdff040000010203040100");
    const std::string path = tmp / "ref_numpy.safetensors";
    spit(path, bytes);
    File f = dqn::st::read_file(path);
    CHECK(f.names() == std::vector<std::string>{"b", "e", "h", "i", "l", "s", "u", "w"});
    CHECK(f.metadata == std::map<std::string, std::string>{{"format", "np"}, {"k", "v"}});
    CHECK(f.get_f32("w", {2, 3}) == std::vector<float>{0, 1, 2, 3, 4, 5});
    CHECK(f.get_f32("h", {3}) == std::vector<float>{1.0f, -2.0f, 65504.0f});
    CHECK(f.get_i32("i", {1, 2}) == std::vector<std::int32_t>{1, -2});
    CHECK(f.get("l").shape.empty());
    CHECK(f.get_scalar_i64("l") == 7);
    CHECK(f.get("b").dtype == DType::BOOL);
    CHECK(f.get("b").bytes == std::vector<std::uint8_t>{1, 0});
    CHECK(f.get("u").bytes == std::vector<std::uint8_t>{0, 1, 2, 3, 4});
    CHECK(f.get("e").shape == std::vector<std::int64_t>{0, 3});
    CHECK(f.get("e").dtype == DType::F64);
    CHECK(f.get("s").dtype == DType::I16);
    CHECK(f.get("s").bytes == std::vector<std::uint8_t>{0xfd, 0xff, 0x04, 0x00});
    // Same tensor order and data as ours; only the metadata order (a hash map there) differs.
    File no_meta = f;
    no_meta.metadata.clear();
    const std::string ours = bytes_str(dqn::st::serialize(no_meta));
    auto split = [](const std::string& file) {
      std::uint64_t n = 0;
      std::memcpy(&n, file.data(), 8);
      return std::pair{file.substr(8, n), file.substr(8 + n)};
    };
    const auto [our_header, our_data] = split(ours);
    const auto [their_header, their_data] = split(bytes);
    CHECK(our_data == their_data);
    // ours: {"l":...}, theirs: {"__metadata__":{...},"l":...}
    const std::string entries = our_header.substr(1, our_header.find_last_not_of(' ') - 1);
    CHECK(entries.rfind("\"l\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[0,8]},\"e\":", 0) == 0);
    CHECK_MESSAGE(their_header.find("}," + entries + "}") != std::string::npos, their_header);
  }
  SUBCASE("safetensors.serialize of a BF16 tensor: our writer gives the same bytes") {
    const std::string bytes = from_hex(
        "38000000000000007b2278223a7b226474797065223a2242463136222c227368617065223a5b335d2c22646174615f6f"
        "666673657473223a5b302c365d7d7d20803f40c0807f");
    const std::string path = tmp / "ref_bf16.safetensors";
    spit(path, bytes);
    File f = dqn::st::read_file(path);
    CHECK(f.get_f32("x", {3}) == std::vector<float>{1.0f, -3.0f, std::numeric_limits<float>::infinity()});
    CHECK(bytes_str(dqn::st::serialize(f)) == bytes);
  }
}

TEST_CASE("safetensors.reject_corrupt") {
  TempDir tmp;
  const std::string f32_2x2 = R"({"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})";
  struct Case {
    const char* why;
    std::string bytes;
    const char* reason;
  };
  const std::vector<Case> cases = {
      {"empty file", "", "file is 0 bytes, shorter than the 8-byte header length"},
      {"5 bytes", "\x01\x02\x03\x04\x05", "file is 5 bytes, shorter than the 8-byte header length"},
      {"header longer than the file", u64_le(200) + std::string(42, ' '),
       "header length 200 is larger than the file (42 bytes after the 8-byte length)"},
      {"absurd header length", u64_le(1'000'000'000) + "{}",
       "header length 1000000000 is absurd (limit 100000000 bytes)"},
      {"all-ones header length", u64_le(~0ull) + "{}", "is absurd"},
      {"a zip (PyTorch .pt) file", std::string("PK\x03\x04\x14\x00\x00\x00\x08\x00", 10) + "junk",
       "zip archive"},
      {"a JSON file", "{\"a\": 1, \"b\": [1, 2, 3]}", "starts with JSON text"},
      {"zero header length", image(""), "header is empty"},
      {"header is an array", image("[1,2]"), "header is an array, expected a JSON object"},
      {"header is a string", image("\"abc\""), "header is a string, expected a JSON object"},
      {"header is bad JSON", image("{\"a\":}"), "header is not valid JSON (byte 6 of the header)"},
      {"header is cut short", image("{\"a\":{\"dtype\""), "header is not valid JSON"},
      {"header not UTF-8", image("{\"\xff\":{}}"), "header is not valid JSON"},
      {"header has trailing NULs", image(std::string("{}\0\0\0\0\0\0", 8)), "header has a NUL byte at offset 2"},
      {"NUL then more JSON", image(std::string("{}\0{\"a\":1}", 10)), "header has a NUL byte at offset 2"},
      {"duplicate tensor name",
       image(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})", 2),
       "header repeats the key 'a'"},
      {"duplicate field", image(R"({"a":{"dtype":"U8","dtype":"I8","shape":[1],"data_offsets":[0,1]}})", 1),
       "header repeats the key 'dtype'"},
      {"entry not an object", image(R"({"a":5})"), "tensor 'a': header entry is a number"},
      {"missing dtype", image(R"({"a":{"shape":[1],"data_offsets":[0,4]}})", 4), "tensor 'a': missing \"dtype\""},
      {"missing shape", image(R"({"a":{"dtype":"F32","data_offsets":[0,4]}})", 4), "tensor 'a': missing \"shape\""},
      {"missing data_offsets", image(R"({"a":{"dtype":"F32","shape":[1]}})", 4),
       "tensor 'a': missing \"data_offsets\""},
      {"dtype not a string", image(R"({"a":{"dtype":4,"shape":[1],"data_offsets":[0,4]}})", 4),
       "tensor 'a': \"dtype\" is a number, expected a string"},
      {"unknown dtype", image(R"({"a":{"dtype":"F8_E4M3","shape":[1],"data_offsets":[0,1]}})", 1),
       "tensor 'a': unknown dtype 'F8_E4M3' (supported: F64, F32, F16, BF16"},
      {"shape not an array", image(R"({"a":{"dtype":"F32","shape":"2x2","data_offsets":[0,16]}})", 16),
       "tensor 'a': \"shape\" is a string, expected an array of integers"},
      {"fractional dimension", image(R"({"a":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})", 8),
       "tensor 'a': shape [2.5]: element 0 is a number, expected a non-negative integer"},
      {"boolean dimension", image(R"({"a":{"dtype":"F32","shape":[true],"data_offsets":[0,4]}})", 4),
       "element 0 is a boolean"},
      {"negative dimension", image(R"({"a":{"dtype":"F32","shape":[2,-1],"data_offsets":[0,0]}})"),
       "tensor 'a': shape [2,-1] has a negative dimension"},
      {"overflowing shape",
       image(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296,4],"data_offsets":[0,0]}})"),
       "tensor 'a': shape [4294967296,4294967296,4] overflows"},
      {"one offset", image(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", 4),
       "tensor 'a': \"data_offsets\" is [0], expected [begin, end]"},
      {"negative offset", image(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})", 4),
       "\"data_offsets\" is [-4,0]"},
      {"offsets not an array", image(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":{"b":0}}})", 4),
       "\"data_offsets\" is {\"b\":0}"},
      {"reversed offsets", image(R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[4,0]}})", 4),
       "tensor 'a': data_offsets [4,0] end before they begin"},
      {"offsets span the wrong size", image(R"({"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,12]}})", 12),
       "tensor 'a': data_offsets [0,12] span 12 bytes, but shape [2,2] of F32 needs 16"},
      {"truncated data", image(f32_2x2, 10),
       "truncated: tensor 'a' needs bytes [0,16) but the data section has 10"},
      {"overlapping tensors",
       image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12),
       "tensors 'a' [0,8) and 'b' [4,12) overlap"},
      {"two tensors on the same bytes",
       image(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"I32","shape":[1],"data_offsets":[0,4]}})", 4),
       "tensors 'a' [0,4) and 'b' [0,4) overlap"},
      {"gap between tensors",
       image(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})", 12),
       "bytes [4,8) of the data section belong to no tensor (gap before 'b')"},
      {"gap at the start", image(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8),
       "bytes [0,4) of the data section belong to no tensor (gap before 'a')"},
      {"trailing garbage", image(f32_2x2, 20),
       "the data section has 20 bytes but the tensors cover only 16 (4 trailing bytes"},
      {"data but no tensors", image("{}      ", 8), "the data section has 8 bytes but the tensors cover only 0"},
      {"metadata not an object", image(R"({"__metadata__":[1]})"), "\"__metadata__\" is an array, expected an object"},
      {"metadata value not a string", image(R"({"__metadata__":{"step":3}})"),
       "\"__metadata__\" key 'step' is a number, expected a string"},
  };
  int i = 0;
  for (const auto& c : cases) {
    const std::string why = c.why;
    CAPTURE(why);
    const std::string path = tmp / ("case" + std::to_string(i++) + ".safetensors");
    spit(path, c.bytes);
    std::string what = error_of(path, [&] { (void)dqn::st::read_file(path); });
    CHECK_MESSAGE(what.find(c.reason) != std::string::npos, what);
  }
}

TEST_CASE("safetensors.reject_unreadable") {
  TempDir tmp;
  SUBCASE("missing file") {
    const std::string path = tmp / "no_such.safetensors";
    std::string what = error_of(path, [&] { (void)dqn::st::read_file(path); });
    CHECK_MESSAGE(what.find("cannot open: No such file or directory") != std::string::npos, what);
  }
  SUBCASE("a directory") {
    const std::string path = tmp / "adir";
    fs::create_directory(path);
    std::string what = error_of(path, [&] { (void)dqn::st::read_file(path); });
    CHECK_MESSAGE(what.find("not a regular file") != std::string::npos, what);
  }
  SUBCASE("a FIFO (an open would wait for a writer forever) and an endless device") {
    const std::string path = tmp / "fifo.safetensors";
    REQUIRE(mkfifo(path.c_str(), 0600) == 0);
    std::string what = error_of(path, [&] { (void)dqn::st::read_file(path); });
    CHECK_MESSAGE(what.find("not a regular file") != std::string::npos, what);
    what = error_of("/dev/zero", [&] { (void)dqn::st::read_file("/dev/zero"); });
    CHECK_MESSAGE(what.find("not a regular file") != std::string::npos, what);
  }
  SUBCASE("a real file cut short, in its data and in its header") {
    File f;
    const float v[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    f.put_f32("x.weight", {2, 4}, v);
    f.put_f32("y", {2}, v);
    const std::string path = tmp / "cut.safetensors";
    auto full = dqn::st::serialize(f);
    spit(path, std::string(full.begin(), full.end() - 3));
    std::string what = error_of(path, [&] { (void)dqn::st::read_file(path); });
    CHECK_MESSAGE(what.find("truncated: tensor 'y' needs bytes [32,40) but the data section has 37") !=
                      std::string::npos,
                  what);
    spit(path, std::string(full.begin(), full.begin() + 20));
    what = error_of(path, [&] { (void)dqn::st::read_file(path); });
    CHECK_MESSAGE(what.find("is larger than the file (12 bytes after the 8-byte length)") != std::string::npos,
                  what);
  }
  SUBCASE("accepted, as by the reference reader: whitespace around the header object") {
    const std::string path = tmp / "spaces.safetensors";
    spit(path, image(" \n{\"a\" : {\"dtype\":\"U8\", \"shape\":[2], \"data_offsets\":[0,2]}}\t ", 2));
    CHECK(dqn::st::read_file(path).get("a").bytes == std::vector<std::uint8_t>{0x11, 0x11});
  }
  SUBCASE("accepted: null metadata, unknown entry fields, odd header length, any key order") {
    const std::string path = tmp / "lenient.safetensors";
    spit(path, image(R"({"b":{"data_offsets":[4,5],"shape":[],"dtype":"U8","extra":1},)"
                     R"("__metadata__":null,"a":{"dtype":"I32","shape":[1],"data_offsets":[0,4]}})",
                     5));
    File g = dqn::st::read_file(path);
    CHECK(g.names() == std::vector<std::string>{"a", "b"});
    CHECK(g.metadata.empty());
    CHECK(g.get("b").bytes == std::vector<std::uint8_t>{0x11});
  }
}

TEST_CASE("safetensors.get_f32_conversion") {
  SUBCASE("every f16 bit pattern against the IEEE formula") {
    for (std::uint32_t h = 0; h < 0x10000; ++h) {
      const int sign = (h >> 15) ? -1 : 1;
      const int exp = (h >> 10) & 0x1f;
      const int mant = h & 0x3ff;
      float got = dqn::st::f16_to_f32(static_cast<std::uint16_t>(h));
      if (exp == 0x1f) {
        if (mant == 0) CHECK(got == sign * std::numeric_limits<float>::infinity());
        else CHECK(std::isnan(got));
        continue;
      }
      double want = exp == 0 ? std::ldexp(mant, -24) : std::ldexp(1.0 + mant / 1024.0, exp - 15);
      want *= sign;
      if (got != static_cast<float>(want) || std::signbit(got) != (sign < 0)) {
        FAIL("f16 0x" << std::hex << h << " gave " << got << ", expected " << want);
      }
    }
  }
  SUBCASE("file tensors of F16, BF16, F64 read as f32") {
    File f;
    auto put16 = [&](const std::string& name, DType d, std::vector<std::uint16_t> bits) {
      Tensor t{d, {static_cast<std::int64_t>(bits.size())}, std::vector<std::uint8_t>(bits.size() * 2)};
      std::memcpy(t.bytes.data(), bits.data(), t.bytes.size());
      f.put(name, std::move(t));
    };
    // f16: 1, -2, 65504 (max), 2^-24 (smallest subnormal), 2^-14 (smallest normal), -0, inf
    put16("h", DType::F16, {0x3c00, 0xc000, 0x7bff, 0x0001, 0x0400, 0x8000, 0x7c00});
    // bf16: 1, -3, 2^-133 (subnormal), the largest finite, -inf, 0.1 truncated
    put16("b", DType::BF16, {0x3f80, 0xc040, 0x0001, 0x7f7f, 0xff80, 0x3dcc});
    const double dv[4] = {0.1, -1e-40, 3.0e38, -0.0};
    Tensor td{DType::F64, {2, 2}, std::vector<std::uint8_t>(32)};
    std::memcpy(td.bytes.data(), dv, 32);
    f.put("d", td);

    TempDir tmp;  // through a file, as the engine will use it
    dqn::st::write_file(tmp / "conv.st", f);
    File g = dqn::st::read_file(tmp / "conv.st");

    auto h = g.get_f32("h", {7});
    CHECK(h[0] == 1.0f);
    CHECK(h[1] == -2.0f);
    CHECK(h[2] == 65504.0f);
    CHECK(h[3] == std::ldexp(1.0f, -24));
    CHECK(h[4] == std::ldexp(1.0f, -14));
    CHECK((h[5] == 0.0f && std::signbit(h[5])));
    CHECK(h[6] == std::numeric_limits<float>::infinity());
    auto b = g.get_f32("b");
    CHECK(b[0] == 1.0f);
    CHECK(b[1] == -3.0f);
    CHECK(b[2] == std::ldexp(1.0f, -133));
    CHECK(b[3] == std::ldexp(255.0f / 128.0f, 127));
    CHECK(b[4] == -std::numeric_limits<float>::infinity());
    CHECK(b[5] == doctest::Approx(0.1f).epsilon(0.01));
    CHECK(b[5] < 0.1f);  // bf16 0x3dcc is 0.1 truncated, not rounded
    auto d = g.get_f32("d", {2, 2});
    CHECK(d[0] == 0.1f);
    CHECK(d[1] == static_cast<float>(-1e-40));
    CHECK(d[2] == 3.0e38f);
    CHECK((d[3] == 0.0f && std::signbit(d[3])));

    const double too_big[1] = {1e39};
    Tensor tb{DType::F64, {1}, std::vector<std::uint8_t>(8)};
    std::memcpy(tb.bytes.data(), too_big, 8);
    g.put("big", tb);
    std::string what = error_of(tmp / "conv.st", [&] { (void)g.get_f32("big"); });
    CHECK_MESSAGE(what.find("tensor 'big' (F64) element 0 is") != std::string::npos, what);
    CHECK(what.find("outside the f32 range") != std::string::npos);
  }
}

TEST_CASE("safetensors.atomic_write") {
  TempDir tmp;
  File old_contents;
  const float ov[3] = {1, 2, 3};
  old_contents.put_f32("old", {3}, ov);
  File new_contents;
  std::vector<float> big(16384, 0.25f);  // 64 KiB of data
  new_contents.put_f32("new", {16384}, big.data());
  const std::string tmp_suffix = ".tmp." + std::to_string(::getpid());

  auto no_temporaries_in = [](const fs::path& dir) {
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().filename().string().find(".tmp.") != std::string::npos) return false;
    return true;
  };

  SUBCASE("overwrite replaces the file and leaves no temporary") {
    const std::string path = tmp / "w.st";
    dqn::st::write_file(path, old_contents);
    dqn::st::write_file(path, new_contents);
    CHECK(dqn::st::read_file(path).names() == std::vector<std::string>{"new"});
    CHECK(no_temporaries_in(tmp.dir));
  }
  SUBCASE("the target path is a directory") {
    const std::string path = tmp / "is_a_dir";
    fs::create_directory(path);
    spit(path + "/keep", "x");
    std::string what = error_of(path, [&] { dqn::st::write_file(path, new_contents); });
    CHECK_MESSAGE(what.find("cannot rename") != std::string::npos, what);
    CHECK_MESSAGE(what.find(std::strerror(EISDIR)) != std::string::npos, what);
    CHECK(fs::is_directory(path));
    CHECK(fs::exists(path + "/keep"));
    CHECK(no_temporaries_in(tmp.dir));
  }
  SUBCASE("the temporary cannot be created: old file intact") {
    const std::string path = tmp / "blocked.st";
    dqn::st::write_file(path, old_contents);
    const auto before = slurp(path);
    fs::create_directory(path + tmp_suffix);  // a directory where the temporary would go
    std::string what = error_of(path, [&] { dqn::st::write_file(path, new_contents); });
    CHECK_MESSAGE(what.find("cannot create temporary file '" + path + tmp_suffix + "'") != std::string::npos,
                  what);
    CHECK_MESSAGE(what.find(std::strerror(EISDIR)) != std::string::npos, what);
    CHECK(slurp(path) == before);
  }
  SUBCASE("a write fails half-way (file size limit): old file intact, temporary removed") {
    const std::string path = tmp / "limited.st";
    dqn::st::write_file(path, old_contents);
    const auto before = slurp(path);
    struct rlimit saved {};
    REQUIRE(::getrlimit(RLIMIT_FSIZE, &saved) == 0);
    auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
    struct rlimit small = saved;
    small.rlim_cur = 16384;
    REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
    std::string what;
    try {
      dqn::st::write_file(path, new_contents);
    } catch (const Error& e) {
      what = e.what();
    }
    ::setrlimit(RLIMIT_FSIZE, &saved);
    std::signal(SIGXFSZ, old_handler);
    CHECK_MESSAGE(what.find("cannot write '" + path + tmp_suffix + "': " + std::strerror(EFBIG)) !=
                      std::string::npos,
                  what);
    CHECK(what.find(path) != std::string::npos);
    CHECK(slurp(path) == before);
    CHECK(no_temporaries_in(tmp.dir));
  }
  SUBCASE("the parent directory does not exist") {
    const std::string path = tmp / "missing_dir/w.st";
    std::string what = error_of(path, [&] { dqn::st::write_file(path, new_contents); });
    CHECK_MESSAGE(what.find(std::strerror(ENOENT)) != std::string::npos, what);
  }
  SUBCASE("invalid contents are refused before the disk is touched") {
    const std::string path = tmp / "invalid.st";
    dqn::st::write_file(path, old_contents);
    const auto before = slurp(path);
    File bad = new_contents;
    bad.tensors["new"].bytes.pop_back();  // bypasses put()'s check
    std::string what = error_of(path, [&] { dqn::st::write_file(path, bad); });
    CHECK_MESSAGE(what.find("cannot write tensor 'new': it has 65535 bytes, but shape [16384] of F32 needs 65536") !=
                      std::string::npos,
                  what);
    File bad_utf8;
    bad_utf8.metadata["k"] = "\xff\xfe";
    what = error_of(path, [&] { dqn::st::write_file(path, bad_utf8); });
    CHECK_MESSAGE(what.find("not valid UTF-8") != std::string::npos, what);
    CHECK(slurp(path) == before);
    CHECK(no_temporaries_in(tmp.dir));
  }
}

TEST_CASE("safetensors.atomic_write.read_only_directory: refused, the old file intact" *
          doctest::skip(::geteuid() == 0) *
          doctest::description("skipped as root, who writes into a read-only directory regardless")) {
  TempDir tmp;
  File old_contents, new_contents;
  const float ov[3] = {1, 2, 3};
  old_contents.put_f32("old", {3}, ov);
  new_contents.put_f32("new", {3}, ov);
  const fs::path ro = tmp.dir / "ro";
  fs::create_directory(ro);
  const std::string path = (ro / "w.st").string();
  dqn::st::write_file(path, old_contents);
  const auto before = slurp(path);
  fs::permissions(ro, fs::perms::owner_read | fs::perms::owner_exec);
  std::string what;
  try {
    dqn::st::write_file(path, new_contents);
  } catch (const std::exception& e) {
    what = e.what();
  }
  fs::permissions(ro, fs::perms::owner_all);
  CHECK_MESSAGE(what.find(std::strerror(EACCES)) != std::string::npos, what);
  CHECK(slurp(path) == before);
}

namespace {
/// Runs a command line through /bin/sh; returns its exit status, or -1 if it did not exit.
int run_shell(const std::string& cmd) {
  int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}
}  // namespace

TEST_CASE("safetensors.st_check_py") {
  // python3 is a requirement of the project (tools/setup.sh installs it): its absence fails here
  const std::string script = std::string(DQN_SOURCE_DIR) + "/tools/st_check.py";
  REQUIRE_MESSAGE(run_shell("command -v python3 >/dev/null 2>&1") == 0, "python3 not found");
  REQUIRE_MESSAGE(fs::exists(script), script << " not found");
  TempDir tmp;
  File f;
  for (DType d : kAllDTypes) f.put(std::string("t.") + dqn::st::dtype_name(d), patterned(d, {3, 2}, 1));
  const float w[4] = {-1.5f, 0.5f, 2.0f, 3.0f};
  f.put_f32("trunk.0.weight", {2, 2}, w);
  const std::int64_t step = 3;
  f.put_i64("adam.step", {}, &step);
  f.put_f32("empty", {0, 3}, nullptr);
  f.metadata["format"] = "dqn";
  const std::string path = tmp / "check.safetensors";
  dqn::st::write_file(path, f);
  // Keep a copy for checking with the reference package elsewhere.
  if (const char* keep = std::getenv("ST_SAMPLE_OUT")) fs::copy_file(path, keep, fs::copy_options::overwrite_existing);

  const std::string out = tmp / "out.txt";
  const std::string cmd = "python3 '" + script + "' '" + path + "'";
  CHECK(run_shell(cmd + " --expect trunk.0.weight,adam.step --prefix-count > '" + out + "' 2>&1") == 0);
  std::ifstream in(out);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CAPTURE(text);
  CHECK(text.find("loader: ") != std::string::npos);
  CHECK(text.find("trunk.0.weight") != std::string::npos);
  CHECK(text.find("min -1.5 max 3 mean 1") != std::string::npos);
  CHECK(text.find("adam.step") != std::string::npos);
  CHECK(text.find("values [3]") != std::string::npos);
  CHECK(text.find("13 tensors") != std::string::npos);
  CHECK(text.find("prefix t: 10") != std::string::npos);
  CHECK(text.find("all 2 expected tensors present") != std::string::npos);

  CHECK(run_shell(cmd + " --expect trunk.0.weight,no.such > /dev/null 2>&1") == 1);
  // A corrupt file is refused, whichever parser is used.
  auto img = slurp(path);
  spit(tmp / "cut.safetensors", std::string(img.begin(), img.end() - 1));
  CHECK(run_shell("python3 '" + script + "' '" + (tmp / "cut.safetensors") + "' > /dev/null 2>&1") == 1);
}
