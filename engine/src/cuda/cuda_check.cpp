/** @file cuda_check.cpp
 *  @brief CUDA and cuBLAS failures as text, and the throwing checks.
 */
#include "cuda/cuda_check.hpp"

#include <stdexcept>

namespace dqn::cuda {

namespace {
std::string where(const char* file, int line, int device) {
  return std::string(" at ") + file + ":" + std::to_string(line) + " (cuda device " + std::to_string(device) + ")";
}

}  // namespace

std::string cuda_text(cudaError_t e, const char* stmt, const char* file, int line, int device) {
  return std::string(stmt) + " failed: " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")" +
         where(file, line, device);
}

std::string cublas_text(cublasStatus_t s, const char* stmt, const char* file, int line, int device) {
  return std::string(stmt) + " failed: " + cublasGetStatusName(s) + " (" + cublasGetStatusString(s) + ")" +
         where(file, line, device);
}


void throw_cuda(cudaError_t e, const char* stmt, const char* file, int line, int device) {
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear a non-sticky error so later launch checks do not see it
    throw std::runtime_error("cuda: " + cuda_text(e, stmt, file, line, device));
  }
}

void throw_cublas(cublasStatus_t s, const char* stmt, const char* file, int line, int device) {
  if (s != CUBLAS_STATUS_SUCCESS) throw std::runtime_error("cuda: " + cublas_text(s, stmt, file, line, device));
}

}  // namespace dqn::cuda
