/** @file pipeline.cpp
 *  @brief The plain pipeline types: where a value came from, how errors read, small helpers.
 */
#include "pipeline/spec.hpp"

#include <cmath>
#include <utility>

namespace dqn {

std::string SourceLoc::str() const {
  std::string f = file.empty() ? "<pipeline>" : file;
  if (line <= 0) return f;  // defaults and overrides have no position
  f += ':' + std::to_string(line);
  if (column > 0) f += ':' + std::to_string(column);
  return f;
}

namespace {

std::string format_error(const SourceLoc& where, const std::string& key, const std::string& value,
                         const std::string& why, const std::string& hint) {
  std::string m = where.str() + ": ";
  if (!key.empty()) {
    m += "key '" + key + "'";
    if (!value.empty()) m += " = '" + value + "'";
    m += ": ";
  }
  m += why;
  if (!hint.empty()) m += "\n  hint: " + hint;
  return m;
}

std::string join_errors(const std::vector<PipelineError>& errors) {
  if (errors.empty()) return "pipeline: no errors recorded";
  std::string m;
  for (const auto& e : errors) {
    if (!m.empty()) m += '\n';
    m += e.what();
  }
  return m;
}

}  // namespace

PipelineError::PipelineError(SourceLoc where, std::string key, std::string value, std::string why,
                             std::string hint)
    : std::runtime_error(format_error(where, key, value, why, hint)),
      where_(std::move(where)),
      key_(std::move(key)),
      value_(std::move(value)),
      why_(std::move(why)),
      hint_(std::move(hint)) {}

PipelineErrors::PipelineErrors(std::vector<PipelineError> errors)
    : std::runtime_error(join_errors(errors)), errors_(std::move(errors)) {}

double PipelineSpec::gamma_n() const { return std::pow(gamma, n_step); }

const HeadSpec& PipelineSpec::primary() const {
  for (const auto& h : heads)
    if (h.role == Role::primary) return h;
  throw std::logic_error("pipeline '" + name + "' has no primary head");
}

const char* to_string(BackendKind b) {
  switch (b) {
    case BackendKind::cpu: return "cpu";
    case BackendKind::cuda: return "cuda";
  }
  return "?";
}

const char* to_string(Precision p) {
  switch (p) {
    case Precision::fp32: return "fp32";
    case Precision::tf32: return "tf32";
    case Precision::bf16: return "bf16";
  }
  return "?";
}

const char* to_string(Role r) {
  switch (r) {
    case Role::primary: return "primary";
    case Role::auxiliary: return "auxiliary";
  }
  return "?";
}

const char* to_string(CudaSpec::Gemm g) {
  switch (g) {
    case CudaSpec::Gemm::automatic: return "auto";
    case CudaSpec::Gemm::cublaslt: return "cublaslt";
    case CudaSpec::Gemm::tile: return "tile";
    case CudaSpec::Gemm::tile16x32: return "tile16x32";
    case CudaSpec::Gemm::tile32x32: return "tile32x32";
    case CudaSpec::Gemm::tile64x64: return "tile64x64";
  }
  return "?";
}

const char* to_string(CudaSpec::TileLoads t) {
  switch (t) {
    case CudaSpec::TileLoads::automatic: return "auto";
    case CudaSpec::TileLoads::plain: return "plain";
    case CudaSpec::TileLoads::ldmatrix: return "ldmatrix";
  }
  return "?";
}

const char* to_string(CudaSpec::Pdl p) {
  switch (p) {
    case CudaSpec::Pdl::automatic: return "auto";
    case CudaSpec::Pdl::small: return "small";
    case CudaSpec::Pdl::all: return "all";
    case CudaSpec::Pdl::off: return "off";
  }
  return "?";
}

std::string update_cluster_text(int blocks) {
  if (blocks == 0) return "auto";
  if (blocks < 0) return "off";
  return std::to_string(blocks);
}

}  // namespace dqn
