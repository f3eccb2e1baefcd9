/** @file cpu_runtime.cpp
 *  @brief The CPU runtime: the reference op table plus plain host memory. No capture (stages run
 *  every step), copies are synchronous, so every report is ready as soon as it is asked for.
 */
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>

#include "cpu/cpu_backend.hpp"
#include "core/runtime.hpp"

namespace dqn {
namespace {

constexpr std::size_t kAlignment = 256;

std::size_t round_up(std::size_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; }

class CpuRuntime final : public Runtime {
 public:
  explicit CpuRuntime(bool f64) : ops_(make_cpu_backend(f64)), f64_(f64) {}

  ~CpuRuntime() override {
    if (arena_) ::operator delete(arena_, std::align_val_t{kAlignment});
  }

  CpuRuntime(const CpuRuntime&) = delete;
  CpuRuntime& operator=(const CpuRuntime&) = delete;

  EngineBackend& ops() noexcept override { return *ops_; }

  void* alloc_arena(std::size_t bytes) override {
    if (arena_)
      throw std::logic_error("cpu runtime: alloc_arena called twice (the arena is allocated once, at freeze; it holds " +
                             std::to_string(arena_bytes_) + " bytes)");
    // Never zero bytes, so an empty arena is still a distinct, freeable pointer.
    const std::size_t size = round_up(bytes == 0 ? 1 : bytes);
    arena_ = ::operator new(size, std::align_val_t{kAlignment});
    std::memset(arena_, 0, size);  // every byte defined before the first step, as on the GPU
    arena_bytes_ = size;
    ++allocations_;
    return arena_;
  }

  void* alloc_host(std::size_t bytes) override {
    void* p = ::operator new(round_up(bytes == 0 ? 1 : bytes), std::align_val_t{kAlignment});
    ++allocations_;
    return p;
  }

  void free_host(void* p) noexcept override {
    if (p) ::operator delete(p, std::align_val_t{kAlignment});
  }

  bool ready(int /*slot*/) override { return true; }
  void wait(int /*slot*/) override {}
  void replay_on(int /*graph*/, int /*lane*/) override {}
  void copy_on(void* dst, const void* src, std::size_t bytes, int /*lane*/) override {
    if (bytes == 0) return;
    if (!dst || !src) throw std::invalid_argument("cpu runtime: copy_on with a null pointer");
    std::memmove(dst, src, bytes);
  }
  void record_on(int /*slot*/, int /*lane*/) override {}
  void wait_on(int /*lane*/, int /*slot*/) override {}
  void sync_lane(int /*lane*/) override {}
  void synchronize() override {}

  std::string describe() const override {
    std::string s = f64_ ? "cpu (f64 reference)" : "cpu (f32 reference)";
    if (arena_)
      s += ", arena " + std::to_string(arena_bytes_) + " bytes, " + std::to_string(allocations_) + " allocations";
    return s;
  }

  std::size_t peak_bytes() const noexcept override { return arena_bytes_; }

 private:
  std::unique_ptr<EngineBackend> ops_;
  bool f64_;
  void* arena_ = nullptr;
  std::size_t arena_bytes_ = 0;
  std::int64_t allocations_ = 0;  ///< every allocation made through this runtime
};

}  // namespace

std::unique_ptr<Runtime> make_cpu_runtime(bool f64) { return std::make_unique<CpuRuntime>(f64); }

}  // namespace dqn
