/** @file onnx_writer.hpp
 *  @brief A PolicyModel as an ONNX model (opset 17): observations → q, actions; written with the
 *  protobuf classes of Debian's libonnx-dev, where the build found it.
 */
#pragma once

#include <string>

namespace dqn {

struct PolicyModel;

/// Whether this build writes ONNX (libonnx-dev found).
bool onnx_available();
/// The model's bytes (a serialised ModelProto; `doc` its doc_string). Throws std::runtime_error in
/// a build without ONNX.
std::string onnx_bytes(const PolicyModel& m, const std::string& doc);

}  // namespace dqn
