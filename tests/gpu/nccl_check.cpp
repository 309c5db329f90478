// GPU check of the NCCL communicator, a plain C++ program (the GPU machine
// has no Criterion).  Exits 77 with "skipped: no CUDA device" where no GPU is
// usable.  One rank on device 0: initialization (no id exchanged), then
// every collective with known values; with one rank all_gather and
// reduce_scatter_sum are copies, the all-reduces leave values unchanged.
// Also: a later call after a failure is not exercised here (that needs a
// second rank to lose), but backend(), rank() and size() are.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "distributed/comm/nccl_communicator.h"
#include "util/error.h"

using namespace pstar;
using namespace pstar::distributed;

namespace {

int passes = 0, failures = 0;

void expect(bool ok, const std::string& what) {
  if (ok) {
    ++passes;
  } else {
    ++failures;
    std::printf("FAIL: %s\n", what.c_str());
  }
}

bool cuda_ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::printf("FAIL: %s: %s\n", what, cudaGetErrorString(e));
  ++failures;
  return false;
}

void run() {
  NcclConfig config;
  config.rank = 0;
  config.size = 1;
  config.device = 0;
  config.timeout = std::chrono::seconds(30);
  auto comm = make_nccl_communicator(config, nullptr);
  expect(std::strcmp(comm->backend(), "nccl") == 0, "backend() is nccl");
  expect(comm->rank() == 0 && comm->size() == 1, "rank 0 of 1");
  expect(!comm->failed(), "not failed after init");

  // all_gather: a copy of 1000 bytes, out of place and in place.
  const size_t n = 1000;
  std::vector<uint8_t> host(n), back(n);
  for (size_t i = 0; i < n; ++i) host[i] = static_cast<uint8_t>(i * 7 + 3);
  uint8_t *d_in = nullptr, *d_out = nullptr;
  if (!cuda_ok(cudaMalloc(&d_in, n), "cudaMalloc") || !cuda_ok(cudaMalloc(&d_out, n), "cudaMalloc")) return;
  cuda_ok(cudaMemcpy(d_in, host.data(), n, cudaMemcpyHostToDevice), "copy in");
  cuda_ok(cudaMemset(d_out, 0, n), "memset");
  comm->all_gather(d_in, d_out, n);
  cuda_ok(cudaMemcpy(back.data(), d_out, n, cudaMemcpyDeviceToHost), "copy back");
  expect(back == host, "all_gather of one rank copies the shard");
  comm->all_gather(d_out, d_out, n);  // in place
  cuda_ok(cudaMemcpy(back.data(), d_out, n, cudaMemcpyDeviceToHost), "copy back");
  expect(back == host, "all_gather in place keeps the shard");

  // reduce_scatter_sum: a copy of the one block.
  const size_t m = 4097;
  std::vector<float> f(m), fback(m, -1.0f);
  for (size_t i = 0; i < m; ++i) f[i] = 0.25f * static_cast<float>(i) - 100.0f;
  float *d_data = nullptr, *d_res = nullptr;
  if (!cuda_ok(cudaMalloc(&d_data, m * sizeof(float)), "cudaMalloc") ||
      !cuda_ok(cudaMalloc(&d_res, m * sizeof(float)), "cudaMalloc"))
    return;
  cuda_ok(cudaMemcpy(d_data, f.data(), m * sizeof(float), cudaMemcpyHostToDevice), "copy in");
  comm->reduce_scatter_sum(d_data, d_res, m);
  cuda_ok(cudaMemcpy(fback.data(), d_res, m * sizeof(float), cudaMemcpyDeviceToHost), "copy back");
  expect(fback == f, "reduce_scatter_sum of one rank copies the block");

  // all_reduce_sum / all_reduce_max: host values unchanged with one rank.
  double d[3] = {1.5, -2.25, 1e300};
  comm->all_reduce_sum(d, 3);
  expect(d[0] == 1.5 && d[1] == -2.25 && d[2] == 1e300, "all_reduce_sum of one rank keeps the values");
  int64_t k[2] = {INT64_MIN + 1, 42};
  comm->all_reduce_max(k, 2);
  expect(k[0] == INT64_MIN + 1 && k[1] == 42, "all_reduce_max of one rank keeps the values");
  // Larger than the first staging allocation.
  std::vector<double> big(1000);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<double>(i) * 0.5;
  comm->all_reduce_sum(big.data(), big.size());
  bool big_ok = true;
  for (size_t i = 0; i < big.size(); ++i) big_ok = big_ok && big[i] == static_cast<double>(i) * 0.5;
  expect(big_ok, "all_reduce_sum of 1000 values (staging grows)");

  // broadcast from root 0.
  cuda_ok(cudaMemcpy(d_in, host.data(), n, cudaMemcpyHostToDevice), "copy in");
  comm->broadcast(d_in, n, 0);
  cuda_ok(cudaMemcpy(back.data(), d_in, n, cudaMemcpyDeviceToHost), "copy back");
  expect(back == host, "broadcast of one rank keeps the data");

  // A bad root is an argument error, not a failure of the group.
  bool threw = false;
  try {
    comm->broadcast(d_in, n, 1);
  } catch (const Error& e) {
    threw = e.status() == PSTAR_ERR_INVALID_ARGUMENT;
  }
  expect(threw, "broadcast with root 1 of 1 throws PSTAR_ERR_INVALID_ARGUMENT");
  expect(!comm->failed(), "an argument error does not fail the communicator");

  comm->barrier();
  expect(!comm->failed(), "barrier");

  // Zero-sized calls are no-ops.
  comm->all_gather(d_in, d_out, 0);
  comm->all_reduce_sum(d, 0);
  expect(!comm->failed(), "zero-sized calls");

  cudaFree(d_in);
  cudaFree(d_out);
  cudaFree(d_data);
  cudaFree(d_res);
}

}  // namespace

int main() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("skipped: no CUDA device\n");
    return 77;
  }
  try {
    run();
  } catch (const std::exception& e) {
    ++failures;
    std::printf("FAIL: exception: %s\n", e.what());
  }
  std::printf("nccl_check: %d passed, %d failed\n", passes, failures);
  return failures == 0 ? 0 : 1;
}
