// The engine's part of a training checkpoint: every buffer that lives across steps (parameters,
// target, optimizer state, spectral-norm vectors, the replay and its tree, the acting snapshot, the
// step counter behind every random draw, the report with its running skip count) as its exact
// bytes, and the host counters that go with them (steps, report copies, staging and snapshot
// hand-offs). Restoring checks everything against this engine's layout before writing anything.
#include <array>
#include <cstring>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/engine.hpp"

namespace dqn {

namespace {

constexpr const char* kPrefix = "engine/";
constexpr const char* kReportCopy = "engine.report_copy/";

/// What lives across steps; with a replay, also the batch the last step drew for the next.
bool saved(const Registry::Buffer& b, bool replay) {
  if (!b.view_of.empty()) return false;
  if (b.kind == BufferKind::parameter || b.kind == BufferKind::optimizer || b.kind == BufferKind::report) return true;
  if (!replay) return false;
  for (const char* name : {buf::states2, buf::actions, buf::rewards, buf::dones, buf::is_weights})
    if (b.name == name) return true;
  return false;
}

st::DType file_dtype(DType d, std::uint32_t real_size) {
  if (d == DType::i32) return st::DType::I32;
  if (d == DType::i64) return st::DType::I64;
  return real_size == 8 ? st::DType::F64 : st::DType::F32;
}

}  // namespace

void Engine::checkpoint_to(st::File& f) {
  rt_->synchronize();  // every queued step, staging copy, refresh and report copy has run
  EngineBackend& be = rt_->ops();
  for (const std::string& name : reg_.buffer_order()) {
    const Registry::Buffer& b = *reg_.find(name);
    if (!saved(b, replay_ != nullptr)) continue;
    st::Tensor t;
    t.dtype = file_dtype(b.dtype, reg_.real_size());
    t.shape = {b.numel()};
    t.bytes.resize(b.bytes);
    be.download(t.bytes.data(), reg_.base() + b.offset_bytes, b.bytes);
    f.put(kPrefix + name, std::move(t));
  }
  nlohmann::json j;
  j["real_size"] = reg_.real_size();
  j["steps"] = steps_;
  j["report_seq"] = reports_.requests();
  j["report_step"] = {reports_.copy_step(0), reports_.copy_step(1)};
  const ReplayStages::Counters rc = replay_ ? replay_->counters() : ReplayStages::Counters{};
  j["replay_seq"] = rc.seq;
  j["replay_added"] = rc.added;
  j["replay_primed"] = rc.primed;
  const ActStages::SnapshotState snap = act_->snapshot_state();
  j["snapshot"] = {{"pending", snap.pending}, {"acted", snap.acted}, {"adopted", snap.adopted}};
  for (int s = 0; s < 2; ++s) {
    if (reports_.copy_step(s) < 0) continue;
    st::Tensor t;
    t.dtype = st::DType::U8;
    t.shape = {std::int64_t(reports_.bytes())};
    t.bytes.assign(reports_.copy(s), reports_.copy(s) + reports_.bytes());
    f.put(kReportCopy + std::to_string(s), std::move(t));
  }
  f.metadata["engine"] = j.dump();
  if (be.status()) throw std::runtime_error(std::string("checkpoint: ") + be.message());
}

void Engine::restore_checkpoint(const st::File& f) {
  const std::string where = "checkpoint '" + f.path + "'";
  auto bad = [&](const std::string& why) { return std::invalid_argument(where + ": " + why); };
  const auto meta = f.metadata.find("engine");
  if (meta == f.metadata.end()) throw bad("no engine state (metadata key 'engine')");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(meta->second);
    if (j.at("real_size").get<std::uint32_t>() != reg_.real_size())
      throw bad("its reals are " + std::to_string(j["real_size"].get<int>()) + " bytes, this engine's " +
                std::to_string(reg_.real_size()));
  } catch (const nlohmann::json::exception& e) {
    throw bad(std::string("engine state unreadable: ") + e.what());
  }
  // Every buffer there and of this engine's size, and nothing else, before anything is written.
  std::size_t expected = 0;
  for (const std::string& name : reg_.buffer_order()) {
    const Registry::Buffer& b = *reg_.find(name);
    if (!saved(b, replay_ != nullptr)) continue;
    ++expected;
    const std::string key = kPrefix + name;
    if (!f.has(key)) throw bad("tensor '" + key + "' is missing: it was written by another pipeline");
    const st::Tensor& t = f.get(key);
    if (t.dtype != file_dtype(b.dtype, reg_.real_size()) || t.bytes.size() != b.bytes)
      throw bad("tensor '" + key + "' is " + st::dtype_name(t.dtype) + " " + st::shape_str(t.shape) + ", this engine's " +
                st::dtype_name(file_dtype(b.dtype, reg_.real_size())) + " [" + std::to_string(b.numel()) +
                "]: it was written by another pipeline");
  }
  std::size_t present = 0;
  for (const auto& [name, t] : f.tensors)
    if (name.rfind(kPrefix, 0) == 0) ++present;
  if (present != expected)
    throw bad("it holds " + std::to_string(present) + " engine buffers, this engine has " + std::to_string(expected) +
              ": it was written by another pipeline");
  std::int64_t steps = 0, seq = 0, rstep[2] = {-1, -1}, replay_seq = 0, replay_added = 0, adopted = 0;
  bool pending = false, acted = false, primed = false;
  try {
    steps = j.at("steps").get<std::int64_t>();
    seq = j.at("report_seq").get<std::int64_t>();
    rstep[0] = j.at("report_step").at(0).get<std::int64_t>();
    rstep[1] = j.at("report_step").at(1).get<std::int64_t>();
    replay_seq = j.at("replay_seq").get<std::int64_t>();
    replay_added = j.at("replay_added").get<std::int64_t>();
    primed = j.at("replay_primed").get<bool>();
    pending = j.at("snapshot").at("pending").get<bool>();
    acted = j.at("snapshot").at("acted").get<bool>();
    adopted = j.at("snapshot").at("adopted").get<std::int64_t>();
  } catch (const nlohmann::json::exception& e) {
    throw bad(std::string("engine state unreadable: ") + e.what());
  }
  if (steps < 0 || seq < 0 || replay_seq < 0 || replay_added < 0 || adopted < 0)
    throw bad("a negative engine counter");
  if (replay_added > 0 && !replay_) throw bad("it holds transitions but this engine has no replay");
  for (int s = 0; s < 2; ++s) {
    if (rstep[s] < 0) continue;
    const std::string key = kReportCopy + std::to_string(s);
    if (!f.has(key) || f.get(key).bytes.size() != reports_.bytes()) throw bad("tensor '" + key + "' missing or of another size");
  }

  rt_->synchronize();
  EngineBackend& be = rt_->ops();
  for (const std::string& name : reg_.buffer_order()) {
    const Registry::Buffer& b = *reg_.find(name);
    if (saved(b, replay_ != nullptr)) be.upload(reg_.base() + b.offset_bytes, f.get(kPrefix + name).bytes.data(), b.bytes);
  }
  std::array<const unsigned char*, 2> copies{nullptr, nullptr};
  for (int s = 0; s < 2; ++s)
    if (rstep[s] >= 0) copies[std::size_t(s)] = f.get(kReportCopy + std::to_string(s)).bytes.data();
  reports_.restore(seq, {rstep[0], rstep[1]}, copies);
  steps_ = steps;
  if (replay_) replay_->restore({replay_seq, replay_added, primed});
  act_->restore_snapshot_state({pending, acted, adopted});
  // The budget fractions the report carries are the device's.
  update_->read_fractions();
  if (be.status()) throw std::runtime_error(std::string("restore_checkpoint: ") + be.message());
}

}  // namespace dqn
