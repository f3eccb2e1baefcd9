/** @file cuda_check.hpp
 *  @brief CUDA and cuBLAS failures as text (the statement, file:line and device), and the macros
 *  the backend's host code checks calls with: inside ops a failure is recorded and the op
 *  returns; outside (creation, runtime methods) it throws.
 */
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <string>

namespace dqn::cuda {

std::string cuda_text(cudaError_t e, const char* stmt, const char* file, int line, int device);
std::string cublas_text(cublasStatus_t s, const char* stmt, const char* file, int line, int device);
/// Throws std::runtime_error ("cuda: " + cuda_text) unless e is cudaSuccess, after clearing a
/// non-sticky error so later launch checks do not see it.
void throw_cuda(cudaError_t e, const char* stmt, const char* file, int line, int device);
void throw_cublas(cublasStatus_t s, const char* stmt, const char* file, int line, int device);

inline std::size_t round_up(std::size_t x, std::size_t a) { return (x + a - 1) / a * a; }

}  // namespace dqn::cuda

// Inside CudaBackend ops: record the first failure (statement, file:line, device) and go on.
#define DQN_CUDA_OK(op, stmt) cuda_ok((op), (stmt), #stmt, __FILE__, __LINE__)
#define DQN_CUBLAS_OK(op, stmt) cublas_ok((op), (stmt), #stmt, __FILE__, __LINE__)
// Outside ops (creation, runtime methods): throw with the same text.
#define DQN_CUDA_THROW(stmt) ::dqn::cuda::throw_cuda((stmt), #stmt, __FILE__, __LINE__, device_)
#define DQN_CUBLAS_THROW(stmt) ::dqn::cuda::throw_cublas((stmt), #stmt, __FILE__, __LINE__, device_)
