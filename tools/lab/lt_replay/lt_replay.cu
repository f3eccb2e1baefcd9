// dqn-lt-replay: replays the cublasLtMatmul calls of a cuBLASLt trace log with cuBLASLt alone, no
// engine code: the same types, shapes, strides, transposes, epilogue, pointer alignments (mod 256)
// and workspace, each with the heuristic's first algorithm (what the engine takes with
// cuda.autotune=false), each distinct call once. A report of compute-sanitizer on the engine's step
// that this reproduces is the library's (or the tool's), not the engine's:
//   CUBLASLT_LOG_LEVEL=2 CUBLASLT_LOG_FILE=lt.log dqn step pipelines/ref.yaml precision=bf16
//     cuda.autotune=false --backend cuda --random-batch 1 --steps 1 --out /tmp/s.safetensors   (one line)
//   compute-sanitizer --tool racecheck dqn-lt-replay lt.log
// (tools/sanitize.sh cuda's lt_all_bf16 does this.) Usage: dqn-lt-replay LOG
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { std::printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); std::exit(3); } } while (0)
#define LK(x) do { cublasStatus_t s_ = (x); if (s_ != CUBLAS_STATUS_SUCCESS) { std::printf("%s:%d %s: status %d\n", __FILE__, __LINE__, #x, int(s_)); ok = false; } } while (0)

using KV = std::map<std::string, std::string>;
static std::string lower(std::string s) { for (auto& c : s) c = char(std::tolower(c)); return s; }
// "name=[k=v k=v ...]" -> map (keys lower case); "name=v" (no bracket) -> {"": v}
static KV field(const std::string& line, const std::string& name) {
  KV kv;
  size_t p = line.find(" " + name + "=");
  if (p == std::string::npos) return kv;
  p += name.size() + 2;
  if (line[p] != '[') { kv[""] = line.substr(p, line.find(' ', p) - p); return kv; }
  const size_t e = line.find(']', p);
  std::string body = line.substr(p + 1, e - p - 1);
  size_t i = 0;
  while (i < body.size()) {
    size_t sp = body.find(' ', i); if (sp == std::string::npos) sp = body.size();
    std::string tok = body.substr(i, sp - i);
    size_t eq = tok.find('=');
    if (eq != std::string::npos) kv[lower(tok.substr(0, eq))] = tok.substr(eq + 1);
    i = sp + 1;
  }
  return kv;
}
static std::string get(const KV& kv, std::initializer_list<const char*> keys, const std::string& dflt = "") {
  for (const char* k : keys) if (auto it = kv.find(k); it != kv.end()) return it->second;
  return dflt;
}
static long long num(const std::string& s) { return s.empty() ? 0 : std::strtoll(s.c_str(), nullptr, 0); }
static const char* g_log = "";
static long g_line = 0;
[[noreturn]] static void bad(const std::string& why) {
  std::fprintf(stderr, "dqn-lt-replay: %s:%ld: %s\n", g_log, g_line, why.c_str());
  std::exit(1);
}
static cudaDataType_t dtype(const std::string& s) {
  if (s == "R_16BF") return CUDA_R_16BF;
  if (s == "R_16F") return CUDA_R_16F;
  if (s == "R_32F") return CUDA_R_32F;
  bad("type '" + s + "': expected R_32F, R_16BF or R_16F");
}
static size_t esize(cudaDataType_t t) { return t == CUDA_R_32F ? 4 : 2; }
static uint32_t align_of(unsigned long long p, long long stride_bytes) {
  unsigned long long x = p | (unsigned long long)stride_bytes;
  if (!x) return 256;
  unsigned long long a = x & (~x + 1);
  return uint32_t(a < 256 ? a : 256);
}

struct Desc { cudaDataType_t t; long long rows, cols, ld, batch, stride; unsigned long long ptr; };
static Desc desc(const std::string& line, const char* name, const char* ptrname) {
  KV kv = field(line, name);
  Desc d{dtype(get(kv, {"type"})), num(get(kv, {"rows"})), num(get(kv, {"cols"})), num(get(kv, {"ld"})),
         num(get(kv, {"batchcount", "batch_count", "batch"}, "1")),
         num(get(kv, {"stridedbatchoffset", "strided_batch_offset", "stride"}, "0")),
         (unsigned long long)num(field(line, ptrname)[""])};
  if (d.batch < 1) d.batch = 1;
  if (d.rows < 1 || d.cols < 1 || d.ld < d.rows || d.stride < 0)
    bad(std::string(name) + ": rows, cols and ld must be positive with ld >= rows (a cublasLtMatmul trace line?)");
  return d;
}
static size_t bytes_of(const Desc& d) { return size_t(d.ld) * d.cols * esize(d.t) + size_t(d.batch - 1) * d.stride * esize(d.t); }

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: dqn-lt-replay LOG   (a cuBLASLt trace log: see the file's header)\n");
    return 2;
  }
  g_log = argv[1];
  std::ifstream in(argv[1]);
  if (!in) {
    std::fprintf(stderr, "dqn-lt-replay: cannot open '%s': %s\n", argv[1], std::strerror(errno));
    return 2;
  }
  std::string line;
  std::set<std::string> seen;
  cublasLtHandle_t lt; cublasLtCreate(&lt);
  cudaStream_t s; CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const size_t ws_bytes = size_t(8) << 20;
  void* ws; CK(cudaMalloc(&ws, ws_bytes));
  int shown = 0, run = 0, failed = 0;
  while (std::getline(in, line)) {
    ++g_line;
    if (line.find("[cublasLtMatmul]") == std::string::npos) continue;
    if (shown < 2) { std::printf("log: %s\n", line.c_str()); ++shown; }
    Desc A = desc(line, "Adesc", "A"), B = desc(line, "Bdesc", "B"), C = desc(line, "Cdesc", "C"), D = desc(line, "Ddesc", "D");
    KV cd = field(line, "computeDesc");
    const std::string ct = get(cd, {"computetype"}), ta = get(cd, {"transa"}), tb = get(cd, {"transb"}),
                      ep = get(cd, {"epilogue"}), bt = get(cd, {"biasdatatype"}), bs = get(cd, {"biasbatchstride"});
    const std::string beta = field(line, "beta")[""];
    char key[512];
    std::snprintf(key, sizeof key, "A %d %lldx%lld ld%lld b%lld s%lld al%u | B %lldx%lld ld%lld s%lld al%u | C %lldx%lld ld%lld s%lld al%u | %s %s %s %s beta %s",
                  int(A.t), A.rows, A.cols, A.ld, A.batch, A.stride, align_of(A.ptr, A.stride * esize(A.t)), B.rows, B.cols, B.ld,
                  B.stride, align_of(B.ptr, B.stride * esize(B.t)), C.rows, C.cols, C.ld, C.stride,
                  align_of(D.ptr, D.stride * esize(D.t)), ct.c_str(), ta.c_str(), tb.c_str(), ep.c_str(), beta.c_str());
    if (!seen.insert(key).second) continue;
    bool ok = true;
    cublasComputeType_t compute = ct.find("TF32") != std::string::npos ? CUBLAS_COMPUTE_32F_FAST_TF32
                                  : ct.find("PEDANTIC") != std::string::npos ? CUBLAS_COMPUTE_32F_PEDANTIC : CUBLAS_COMPUTE_32F;
    cublasOperation_t opa = ta.find('T') != std::string::npos || ta == "1" ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t opb = tb.find('T') != std::string::npos || tb == "1" ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasLtEpilogue_t epi = ep.find("RELU_BIAS") != std::string::npos ? CUBLASLT_EPILOGUE_RELU_BIAS
                             : ep.find("BIAS") != std::string::npos ? CUBLASLT_EPILOGUE_BIAS
                             : ep.find("RELU") != std::string::npos ? CUBLASLT_EPILOGUE_RELU : CUBLASLT_EPILOGUE_DEFAULT;
    // buffers that keep each logged pointer's alignment (mod 256)
    auto buf = [&](const Desc& d) {
      char* p; CK(cudaMalloc(&p, bytes_of(d) + 512));
      CK(cudaMemset(p, 0, bytes_of(d) + 512));
      return p;
    };
    char *pa = buf(A), *pb = buf(B), *pc = buf(C);
    void* a = pa + (A.ptr % 256), *b = pb + (B.ptr % 256), *c = pc + (D.ptr % 256);
    float* bias = nullptr;
    const size_t bias_bytes = size_t(C.rows + num(bs) * C.batch) * 4 + 256;
    CK(cudaMalloc(&bias, bias_bytes));
    CK(cudaMemset(bias, 0, bias_bytes));
    cublasLtMatmulDesc_t md; cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulPreference_t pref;
    LK(cublasLtMatmulDescCreate(&md, compute, CUDA_R_32F));
    LK(cublasLtMatmulDescSetAttribute(md, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
    LK(cublasLtMatmulDescSetAttribute(md, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
    auto layout = [&](cublasLtMatrixLayout_t* l, const Desc& d) {
      LK(cublasLtMatrixLayoutCreate(l, d.t, d.rows, d.cols, d.ld));
      if (d.batch > 1) {
        int32_t cnt = int32_t(d.batch);
        LK(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &cnt, sizeof cnt));
        LK(cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &d.stride, sizeof d.stride));
      }
    };
    layout(&la, A); layout(&lb, B); layout(&lc, C);
    if (epi != CUBLASLT_EPILOGUE_DEFAULT) {
      LK(cublasLtMatmulDescSetAttribute(md, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
      if (epi != CUBLASLT_EPILOGUE_RELU) {
        int32_t btype = CUDA_R_32F;
        LK(cublasLtMatmulDescSetAttribute(md, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &btype, sizeof btype));
        LK(cublasLtMatmulDescSetAttribute(md, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
        int64_t bstride = num(bs);
        if (C.batch > 1) LK(cublasLtMatmulDescSetAttribute(md, CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, &bstride, sizeof bstride));
      }
    }
    LK(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t wsz = ws_bytes;
    uint32_t al_a = align_of(A.ptr, A.stride * esize(A.t)), al_b = align_of(B.ptr, B.stride * esize(B.t)),
             al_c = align_of(D.ptr, D.stride * 4);
    LK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsz, sizeof wsz));
    LK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof al_a));
    LK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof al_b));
    LK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof al_c));
    LK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, sizeof al_c));
    cublasLtMatmulHeuristicResult_t res{}; int found = 0;
    LK(cublasLtMatmulAlgoGetHeuristic(lt, md, la, lb, lc, lc, pref, 1, &res, &found));
    const float alpha = 1.f, betav = float(std::atof(beta.c_str()));
    if (ok && found > 0) {
      LK(cublasLtMatmul(lt, md, &alpha, a, la, b, lb, &betav, c, lc, c, lc, &res.algo, ws, ws_bytes, s));
      CK(cudaStreamSynchronize(s));
    } else {
      ok = false;
    }
    std::printf("%s %s\n", ok ? "ran " : "FAIL", key);
    ++run; failed += !ok;
    cublasLtMatmulPreferenceDestroy(pref); cublasLtMatrixLayoutDestroy(la); cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc); cublasLtMatmulDescDestroy(md);
    CK(cudaFree(pa)); CK(cudaFree(pb)); CK(cudaFree(pc)); CK(cudaFree(bias));
  }
  if (run == 0) {
    std::fprintf(stderr, "dqn-lt-replay: %s: no cublasLtMatmul line (CUBLASLT_LOG_LEVEL=2 writes them)\n", argv[1]);
    return 1;
  }
  std::printf("dqn-lt-replay: %d distinct matmuls, %d failed\n", run, failed);
  return failed ? 1 : 0;
}
