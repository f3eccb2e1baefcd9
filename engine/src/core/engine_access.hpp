/** @file engine_access.hpp
 *  @brief What tools and tests do with an engine between steps, through its public parts: the
 *  weights (seeded initialisation, weights files), host copies of the batch and of any buffer,
 *  random transitions for benchmarks, and the explanation of the built step. Every function here
 *  synchronises.
 */
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/engine.hpp"
#include "core/host_batch.hpp"
#include "core/safetensors.hpp"

namespace dqn {

// --- weights (weights.cpp) ---
/// Seeded initial weights (docs/step-math.md, "Initialisation"): target = online, zero moments,
/// step 0, the spectral norm's vectors; broadcast to every rank, the acting snapshot refreshed.
void init_weights(Engine& e, std::uint64_t seed);
/// Loads a weights file (every value checked before any is uploaded); throws st::Error /
/// std::invalid_argument naming the file and the tensor.
void load_weights(Engine& e, const st::File& f);
/// The weights file (online, target, Adam, sn.u); with `dump`, the last step's report too.
st::File save_weights(Engine& e, bool dump);

// --- host copies (host_access.cpp) ---
/// The batch the next step trains on (a replay's step draws its own).
void set_batch(Engine& e, const HostBatch& b);
/// The online parameters as one flat f32 vector laid out as registry().params() says.
std::vector<float> online_params(Engine& e);
/// A buffer's contents as doubles, and one element written; through the layout, never a counted
/// lookup.
std::vector<double> host_buffer(Engine& e, const std::string& name);
void host_write(Engine& e, const std::string& name, std::int64_t index, double value);

/// Transitions a fill_replay_random call adds at once (the staging rows a filled engine wants).
inline constexpr std::int64_t kReplayFillChunk = 65536;
/// Fills the engine's replay with n random transitions for its pipeline's shapes (states and
/// rewards in [-1, 1], 10 % dones, uniform actions; seeded from the rank's seed), through the
/// replay's add as the environments would: for benchmarks and tools (host_batch.cpp).
void fill_replay_random(Engine& e, std::int64_t n);

// --- the built step (explain.cpp) ---
/// The stage order and the registry layout (`dqn step --explain`).
std::string explain(Engine& e);
/// Per stage (in order) the earlier stages it waits for when stages run side by side (their
/// byte ranges overlap, one of the two writing): what the captured graph's edges follow.
std::vector<std::pair<std::string, std::vector<std::string>>> stage_waits(const Engine& e);
/// Lanes (concurrent streams) the captured step uses; 1 on the CPU.
int lanes_used(const Engine& e);

}  // namespace dqn
