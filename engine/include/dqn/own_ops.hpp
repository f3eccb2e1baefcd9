/** @file own_ops.hpp
 *  @brief Helpers for a head's own ops (a computation no op of the table does): checking their
 *  arguments as the backends check theirs, running the host half with the backend's real type,
 *  and the refusal of a plugin built without its device half. The device half launches through
 *  dqn/device.cuh. A plugin compiled with CUDA defines DQN_WITH_CUDA=1 (dqn-engine.pc says how).
 *
 *    void my_loss(Backend& be, const MyLoss& a) noexcept {
 *      if (!real_arg(be, "my_loss", a.q, "q")) return;             // … every argument
 *      if (const DeviceContext* ctx = be.device()) {
 *    #if DQN_WITH_CUDA
 *        return my_loss_cuda(be, *ctx, a);                          // compiled by nvcc
 *    #else
 *        return no_device_code(be, "my_loss");
 *    #endif
 *      }
 *      with_host_real(be, [&](auto zero) { my_loss_host<decltype(zero)>(a); });
 *    }
 */
#pragma once

#include <cstdio>

#include "dqn/backend.hpp"

#ifndef DQN_WITH_CUDA
#define DQN_WITH_CUDA 0
#endif

namespace dqn {

/// Checks a real argument of op: not null, and of the backend's element size. Records the
/// failure on the backend and returns false otherwise.
inline bool real_arg(Backend& be, const char* op, const Real& r, const char* what) noexcept {
  char why[160];
  if (!r.p) {
    std::snprintf(why, sizeof why, "null pointer '%s'", what);
  } else if (r.esize != be.real_size()) {
    std::snprintf(why, sizeof why, "'%s' has element size %u, this backend stores %u-byte reals", what, r.esize,
                  be.real_size());
  } else {
    return true;
  }
  be.fail(op, why);
  return false;
}

/// f(T{}) with T the host backend's real type: float, or double on the f64 reference.
template <class F>
void with_host_real(Backend& be, F&& f) {
  if (be.real_size() == sizeof(double))
    f(double{});
  else
    f(float{});
}

/// What a device backend gets from an op whose plugin was built without its CUDA half.
inline void no_device_code(Backend& be, const char* op) noexcept {
  be.fail(op, "this plugin was built without CUDA (no nvcc when it was configured): rebuild it with CUDA");
}

}  // namespace dqn
