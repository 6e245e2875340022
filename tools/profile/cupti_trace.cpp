// A kernel timeline for the GPU machine, where Nsight Systems is not installed: a CUDA injection
// library (CUPTI activity records of every kernel, CUDA-graph nodes included) that writes
// start_ns,end_ns,stream,graph_node,grid,block,name rows to $OASIS_TRACE_OUT at exit.
//
//   export CUDA_INJECTION64_PATH=$PWD/.bundle/lib/liboasis_cupti_trace.so OASIS_TRACE_OUT=t.csv
//   .bundle/bin/bench_decode --config ... --batch 1 --steps 8
//   python3 tools/profile/kernel_gaps.py t.csv      # per-kernel in-graph times and gaps
//
// Kernels overlap under PDL, so the rows show what the isolated timings of ncu cannot: how long
// each kernel runs inside the step and where the GPU waits between kernels.
#include <cupti.h>
#include <cxxabi.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

namespace {

struct Row {
  uint64_t start, end, graph_node;
  uint32_t stream;
  int32_t grid, block;
  std::string name;
};

std::mutex mu;
std::vector<Row>* rows = nullptr;

std::string Demangle(const char* name) {
  if (name == nullptr) return "?";
  int status = 0;
  char* d = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string s = status == 0 && d != nullptr ? d : name;
  std::free(d);
  for (char& c : s) {
    if (c == ',') c = ';';  // CSV
  }
  return s;
}

void CUPTIAPI BufferRequested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *size = size_t{8} << 20;
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, *size));
  *max_records = 0;
}

void CUPTIAPI BufferCompleted(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* record = nullptr;
  std::lock_guard<std::mutex> lock(mu);
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL &&
        record->kind != CUPTI_ACTIVITY_KIND_KERNEL)
      continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
    rows->push_back({k->start, k->end, k->graphNodeId, k->streamId, k->gridX * k->gridY * k->gridZ,
                     k->blockX * k->blockY * k->blockZ, Demangle(k->name)});
  }
  std::free(buffer);
}

void Flush() {
  cuptiActivityFlushAll(1);
  const char* out = std::getenv("OASIS_TRACE_OUT");
  FILE* f = std::fopen(out != nullptr ? out : "oasis_trace.csv", "w");
  if (f == nullptr) return;
  std::fprintf(f, "start_ns,end_ns,stream,graph_node,grid,block,name\n");
  std::lock_guard<std::mutex> lock(mu);
  for (const Row& r : *rows) {
    std::fprintf(f, "%llu,%llu,%u,%llu,%d,%d,%s\n", static_cast<unsigned long long>(r.start),
                 static_cast<unsigned long long>(r.end), r.stream,
                 static_cast<unsigned long long>(r.graph_node), r.grid, r.block, r.name.c_str());
  }
  std::fclose(f);
  std::fprintf(stderr, "cupti_trace: %zu kernels\n", rows->size());
}

}  // namespace

// Called by the CUDA driver when CUDA_INJECTION64_PATH names this library.
extern "C" __attribute__((visibility("default"))) int InitializeInjection() {
  rows = new std::vector<Row>();
  if (cuptiActivityRegisterCallbacks(BufferRequested, BufferCompleted) != CUPTI_SUCCESS ||
      cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
    std::fprintf(stderr, "cupti_trace: CUPTI could not be set up\n");
    return 0;
  }
  std::atexit(Flush);
  return 1;
}
