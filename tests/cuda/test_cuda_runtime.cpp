// The CUDA backend's runtime behaviour: device queries, automatic backend choice, workspaces
// (library-kept and caller-provided), streams without hidden synchronization, CUDA graph capture,
// concurrent streams, and errors for memory the device cannot read.
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cuda/cuda_testutil.hpp"

using namespace qsdpa;
using test::Case;

namespace {

Case decode_case(uint64_t seed) {
  Case c;
  c.dtype = DType::f16, c.kf = c.vf = {4, 64};
  c.B = 2, c.Hq = 8, c.Hkv = 2, c.Lq = 1, c.N = 3000, c.D = 128, c.sinks = true, c.seed = seed;
  return c;
}

bool all_bytes(const std::vector<uint8_t>& v, uint8_t x) {
  for (uint8_t b : v)
    if (b != x) return false;
  return true;
}

struct Stream {
  cudaStream_t s = nullptr;
  Stream() { cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking); }
  ~Stream() { cudaStreamDestroy(s); }
};

// Captures attention(p) on stream `stream` into a graph and replays it `replays` times, out
// poisoned before each replay and held to `check` after.
void capture_and_replay(const AttentionParams& p, cudaStream_t stream, test::DeviceProblem& d,
                        const test::ReferenceCheck& check, int replays) {
  cudaGraph_t graph = nullptr;
  CUDA_ASSERT(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  const Status s = attention(p);
  const cudaError_t end = cudaStreamEndCapture(stream, &graph);
  ASSERT_TRUE(s.ok()) << s.message;
  CUDA_ASSERT(end);
  cudaGraphExec_t exec = nullptr;
  CUDA_ASSERT(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < replays; ++replay) {
    d.poison();
    CUDA_ASSERT(cudaGraphLaunch(exec, stream));
    CUDA_ASSERT(cudaStreamSynchronize(stream));
    ASSERT_EQ(d.fetch(), "");
    EXPECT_EQ(check(d.host.out.data()), "") << "replay " << replay;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

}  // namespace

TEST(CudaRuntime, AvailableAndDescribed) {
  QSDPA_REQUIRE_CUDA();
  EXPECT_TRUE(backend_built(Backend::cuda));
  const std::string info = device_info();
  EXPECT_NE(info.find("cuda:0:"), std::string::npos) << info;
  EXPECT_NE(build_info().find("cuda"), std::string::npos);
}

TEST(CudaRuntime, AutomaticPicksCudaForDeviceData) {
  QSDPA_REQUIRE_CUDA();
  test::Problem h(decode_case(1));
  test::DeviceProblem d(h);
  AttentionParams p = d.params();
  p.backend = Backend::automatic;
  const Status s = attention(p);
  ASSERT_TRUE(s.ok()) << s.message;
  EXPECT_EQ(s.backend, Backend::cuda);
  ASSERT_EQ(d.fetch(), "");
  EXPECT_EQ(d.check(), "");
}

TEST(CudaRuntime, CallerWorkspace) {
  QSDPA_REQUIRE_CUDA();
  test::Problem h(decode_case(2));
  test::DeviceProblem d(h);
  AttentionParams p = d.params();
  const size_t bytes = attention_workspace_size(p);
  ASSERT_GT(bytes, 0u);

  // Too small: an error naming workspace_bytes, and nothing written.
  test::DeviceBuffer ws(bytes + 64);
  p.workspace = ws.get();
  p.workspace_bytes = bytes - 1;
  Status s = attention(p);
  EXPECT_EQ(s.code, StatusCode::invalid_argument);
  EXPECT_NE(s.message.find("workspace_bytes"), std::string::npos) << s.message;
  ASSERT_EQ(d.fetch(), "");
  EXPECT_TRUE(all_bytes(h.out, 0xff)) << "out was written by a failing call";

  // Exactly the size asked for, at an address that is only 4-byte aligned.
  p.workspace = ws.as<char>() + 4;
  p.workspace_bytes = bytes;
  s = attention(p);
  ASSERT_TRUE(s.ok()) << s.message;
  ASSERT_EQ(d.fetch(), "");
  EXPECT_EQ(d.check(), "");

  // No workspace needed without keys.
  AttentionParams empty = p;
  empty.N = 0;
  EXPECT_EQ(attention_workspace_size(empty), 0u);
}

TEST(CudaRuntime, GrowingLibraryWorkspace) {
  QSDPA_REQUIRE_CUDA();
  Stream st;
  for (int64_t n : {100, 5000, 60000, 700}) {  // each larger problem grows the stream's buffer
    Case c = decode_case(uint64_t(n));
    c.N = n;
    AttentionParams o{};
    o.stream = st.s;
    EXPECT_EQ(test::run_cuda_case(c, &o), "") << c.str();
  }
}

// The call returns while the stream is still blocked behind earlier work: nothing in it waits.
TEST(CudaRuntime, NoHiddenSynchronization) {
  QSDPA_REQUIRE_CUDA();
  Stream st;
  test::Problem h(decode_case(3));
  test::DeviceProblem d(h);
  AttentionParams p = d.params();
  p.stream = st.s;
  ASSERT_TRUE(attention(p).ok());  // the first call may grow the stream's workspace
  CUDA_ASSERT(cudaStreamSynchronize(st.s));
  d.poison();

  auto sleep_ms = [](void* ms) { std::this_thread::sleep_for(std::chrono::milliseconds(*static_cast<int*>(ms))); };
  static int block_ms = 400;
  CUDA_ASSERT(cudaLaunchHostFunc(st.s, sleep_ms, &block_ms));
  const auto t0 = std::chrono::steady_clock::now();
  const Status s = attention(p);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(s.ok()) << s.message;
  EXPECT_LT(ms, 200.0) << "attention() waited for the stream";
  CUDA_ASSERT(cudaStreamSynchronize(st.s));
  ASSERT_EQ(d.fetch(), "");
  EXPECT_EQ(d.check(), "");
}

TEST(CudaRuntime, GraphCaptureWithWorkspace) {
  QSDPA_REQUIRE_CUDA();
  Stream st;
  Case c = decode_case(4);
  c.bool_mask = test::MaskKind::u8, c.window = 2000, c.Lq = 2;
  test::Problem h(c);
  test::DeviceProblem d(h);
  AttentionParams p = d.params();
  p.stream = st.s;
  const size_t bytes = attention_workspace_size(p);
  test::DeviceBuffer ws(bytes);
  p.workspace = ws.get(), p.workspace_bytes = bytes;

  ASSERT_NO_FATAL_FAILURE(capture_and_replay(p, st.s, d, test::ReferenceCheck(h.params(Backend::reference)), 2));
}

namespace {

// A decode step large enough that its row tiles' splits do not run as clusters (more blocks than
// multiprocessors): the tensor-core kernel merges them itself, or the combine kernel does.
Case many_blocks_case(uint64_t seed) {
  Case c;
  c.dtype = DType::f16, c.kf = c.vf = {4, 64};
  c.B = 4, c.Hq = 32, c.Hkv = 8, c.Lq = 1, c.N = 8192, c.D = 128, c.sinks = true, c.seed = seed;
  return c;
}

struct RestoreInKernelMerge {
  bool was = cuda::set_in_kernel_merge(true);
  ~RestoreInKernelMerge() { cuda::set_in_kernel_merge(was); }
};
struct RestoreCombineArrivals {
  bool was = cuda::set_combine_arrivals(false);
  ~RestoreCombineArrivals() { cuda::set_combine_arrivals(was); }
};

}  // namespace

// The in-kernel merge of the splits counts each row tile's arrivals in the workspace and leaves
// the counters at zero: calls of different grids and split counts one after another on one
// stream's library workspace, each repeated, each output poisoned before and checked after (a
// counter left non-zero makes the next call's last split miss its turn: out stays poisoned, or is
// merged before all splits are in).
TEST(CudaRuntime, InKernelMergeAcrossCalls) {
  QSDPA_REQUIRE_CUDA();
  const RestoreInKernelMerge restore;  // (on for the test, as it was after)
  Stream st;
  std::vector<Case> cases;
  Case c = many_blocks_case(30);
  cases.push_back(c);
  c.B = 2, c.Lq = 3, c.N = 30000, c.window = 9000, c.bool_mask = test::MaskKind::u8, c.seed = 31;
  cases.push_back(c);
  c = many_blocks_case(32);
  c.dtype = DType::bf16, c.kf = {8, 64}, c.vf = {4, 64}, c.B = 8, c.Hq = 16, c.Hkv = 4, c.N = 5000, c.D = 256;
  cases.push_back(c);
  c = many_blocks_case(33);
  c.B = 3, c.Hq = 16, c.Hkv = 16, c.N = 2000, c.D = 64, c.float_mask = true, c.sinks = false;
  cases.push_back(c);
  // (each problem, its device copy and its reference made once: the rounds interleave the calls)
  std::vector<std::unique_ptr<test::Problem>> hs;
  std::vector<std::unique_ptr<test::DeviceProblem>> ds;
  std::vector<std::unique_ptr<test::ReferenceCheck>> refs;
  for (const Case& cs : cases) {
    hs.push_back(std::make_unique<test::Problem>(cs));
    ds.push_back(std::make_unique<test::DeviceProblem>(*hs.back()));
    refs.push_back(std::make_unique<test::ReferenceCheck>(hs.back()->params(Backend::reference)));
  }
  bool any_taken = false;
  for (int round = 0; round < 2; ++round)
    for (size_t k = 0; k < cases.size(); ++k) {
      test::DeviceProblem& d = *ds[k];
      AttentionParams p = d.params();
      p.stream = st.s;
      any_taken = any_taken || cuda::uses_in_kernel_merge(p);
      for (int rep = 0; rep < 3; ++rep) {
        d.poison();
        const Status s = attention(p);
        ASSERT_TRUE(s.ok()) << s.message;
        ASSERT_EQ(d.fetch(), "");
        EXPECT_EQ((*refs[k])(d.host.out.data()), "") << "round " << round << ", call " << rep << ": " << cases[k].str();
      }
    }
  EXPECT_TRUE(any_taken) << "no case took the in-kernel merge";
  // The same problem with the in-kernel merge forbidden: partials and the combine kernel.
  cuda::set_in_kernel_merge(false);
  test::Problem h(cases[0]);
  test::DeviceProblem d(h);
  EXPECT_FALSE(cuda::uses_in_kernel_merge(d.params()));
  EXPECT_EQ(test::run_cuda_case(cases[0]), "") << "combine kernel: " << cases[0].str();
}

// A caller's workspace is taken as zero-filled only when it says so (workspace_zeroed); then the
// splits merge in the attention kernel, also in a captured graph replayed several times (the
// counters set back to zero on every replay).
TEST(CudaRuntime, ZeroedCallerWorkspaceAndGraphReplays) {
  QSDPA_REQUIRE_CUDA();
  const RestoreInKernelMerge restore;
  Stream st;
  Case c = many_blocks_case(34);
  c.Lq = 2, c.window = 5000, c.float_mask = true;
  test::Problem h(c);
  test::DeviceProblem d(h);
  AttentionParams p = d.params();
  p.stream = st.s;
  const size_t bytes = attention_workspace_size(p);
  test::DeviceBuffer ws(bytes);
  CUDA_ASSERT(cudaMemsetAsync(ws.get(), 0, bytes, st.s));  // (on the stream the calls use)
  p.workspace = ws.get(), p.workspace_bytes = bytes;
  EXPECT_FALSE(cuda::uses_in_kernel_merge(p)) << "a caller's workspace taken as zero-filled unasked";
  p.workspace_zeroed = true;
  const bool in_kernel = cuda::uses_in_kernel_merge(p);
  EXPECT_TRUE(in_kernel || !cuda::uses_tensor_cores(p)) << c.str();

  const test::ReferenceCheck check(h.params(Backend::reference));  // (the reference once)
  ASSERT_NO_FATAL_FAILURE(capture_and_replay(p, st.s, d, check, 4));
  // and a direct call on the same workspace after the replays
  d.poison();
  ASSERT_TRUE(attention(p).ok());
  CUDA_ASSERT(cudaStreamSynchronize(st.s));
  ASSERT_EQ(d.fetch(), "");
  EXPECT_EQ(check(h.out.data()), "");
}

namespace {

struct RestoreClusterMerge {
  bool was = cuda::set_cluster_merge(true);
  ~RestoreClusterMerge() { cuda::set_cluster_merge(was); }
};

struct RestoreBlockPool {
  int was = cuda::set_block_pool(1);
  bool was_cluster = cuda::set_pool_cluster(false);
  ~RestoreBlockPool() {
    cuda::set_block_pool(was);
    cuda::set_pool_cluster(was_cluster);
  }
};

// Calls one after another on one stream, each reading as its q the out of the call before it.
// Checks each call against the reference on the input it really had (the previous call's output,
// fetched): "" or what went wrong.
std::string check_chain(test::Problem& h, const std::vector<std::vector<uint8_t>>& outs) {
  for (size_t i = 0; i < outs.size(); ++i) {
    AttentionParams r = h.params(Backend::reference);
    if (i > 0) r.q = outs[i - 1].data();
    if (std::string e = test::ReferenceCheck(r)(outs[i].data()); !e.empty())
      return "call " + std::to_string(i) + " of the chain: " + e;
  }
  return "";
}

}  // namespace

// Launched as programmatic dependents (AttentionParams::pdl, the default), a call's blocks may be
// placed while the call before it still runs; they must not read q, nor use the shared workspace,
// before it has finished. A chain of calls with nothing between them, each reading the previous
// call's out as its q (poisoned, NaN, until written), on every merge path (clusters, in the
// kernel, the combine kernel) and the tile pool's blocks (sm_90a), directly and replayed from a
// graph; and the same with pdl false.
TEST(CudaRuntime, ChainedCallsWaitForTheirInputs) {
  QSDPA_REQUIRE_CUDA();
  const RestoreInKernelMerge restore_in_kernel;
  const RestoreCombineArrivals restore_arrivals;
  const RestoreClusterMerge restore_cluster;
  const RestoreBlockPool restore_pool;
  constexpr int kCalls = 3;
  Stream st;
  struct Path {
    const char* name;
    int64_t B;
    bool cluster, in_kernel;
    int pool;  // cuda::set_block_pool's mode: 0 none, 2 blocks of 16 warps, 3 blocks of 8
    bool arrivals = false;  // the combine kernel's rows wait for their row tile (cuda::set_combine_arrivals)
  };
  for (const Path& path : {Path{"clusters", 1, true, false, 0}, Path{"in-kernel merge", 4, false, true, 0},
                           Path{"combine kernel", 4, false, false, 0},
                           Path{"combine kernel, counted arrivals", 4, false, false, 0, true},
                           Path{"tile pool", 4, false, true, 2}, Path{"tile pool in clusters", 8, true, false, 2},
                           Path{"tile pool, blocks of 8 warps", 4, false, true, 3}})
    for (const bool pdl : {true, false}) {
      SCOPED_TRACE(std::string(path.name) + (pdl ? ", pdl" : ", no pdl"));
      if (path.pool && !device_takes_sm90a_kernels()) continue;  // (the pool's instantiations are sm_90a's)
      cuda::set_cluster_merge(path.cluster);
      cuda::set_in_kernel_merge(path.in_kernel);
      cuda::set_block_pool(path.pool);
      cuda::set_pool_cluster(path.pool && path.cluster);
      cuda::set_combine_arrivals(path.arrivals);
      Case c = many_blocks_case(40);
      c.B = path.B, c.N = path.cluster ? 4096 : 2048;
      test::Problem h(c);
      test::DeviceProblem d(h);
      std::vector<test::DeviceBuffer> outs;
      std::vector<AttentionParams> ps;
      for (int i = 0; i < kCalls; ++i) {
        outs.emplace_back(h.out.size());
        AttentionParams p = d.params();
        p.stream = st.s, p.pdl = pdl;
        p.q = i == 0 ? d.q.get() : outs[size_t(i - 1)].get();
        p.out = outs.back().get();
        ps.push_back(p);
      }
      EXPECT_EQ(cuda::uses_cluster_merge(ps[0]), path.cluster) << c.str();
      EXPECT_EQ(cuda::uses_in_kernel_merge(ps[0]), path.in_kernel) << c.str();
      EXPECT_EQ(cuda::planned_pool(ps[0]), path.pool ? path.pool - 1 : 0) << c.str();
      EXPECT_EQ(cuda::uses_combine_arrivals(ps[0]), path.arrivals && pdl && sm90_or_newer()) << c.str();
      const size_t bytes = attention_workspace_size(ps[0]);
      test::DeviceBuffer ws(bytes);
      CUDA_ASSERT(cudaMemsetAsync(ws.get(), 0, bytes, st.s));
      const auto poison = [&] {
        for (auto& o : outs) CUDA_ASSERT(cudaMemsetAsync(o.get(), 0xff, o.bytes(), st.s));
      };
      std::vector<std::vector<uint8_t>> host(kCalls, std::vector<uint8_t>(h.out.size()));
      const auto fetch_and_check = [&](const char* how) {
        CUDA_ASSERT(cudaStreamSynchronize(st.s));
        for (int i = 0; i < kCalls; ++i)
          CUDA_ASSERT(cudaMemcpy(host[size_t(i)].data(), outs[size_t(i)].get(), h.out.size(), cudaMemcpyDeviceToHost));
        EXPECT_EQ(check_chain(h, host), "") << how << ": " << c.str();
      };
      // directly, on the library's workspace
      poison();
      for (const AttentionParams& p : ps) ASSERT_TRUE(attention(p).ok());
      ASSERT_NO_FATAL_FAILURE(fetch_and_check("direct calls"));
      // captured into one graph, on a caller's workspace (zero-filled: the in-kernel merge takes it)
      cudaGraph_t graph = nullptr;
      CUDA_ASSERT(cudaStreamBeginCapture(st.s, cudaStreamCaptureModeGlobal));
      bool ok = true;
      for (AttentionParams p : ps) {
        p.workspace = ws.get(), p.workspace_bytes = bytes, p.workspace_zeroed = true;
        ok = attention(p).ok() && ok;
      }
      const cudaError_t end = cudaStreamEndCapture(st.s, &graph);
      ASSERT_TRUE(ok);
      CUDA_ASSERT(end);
      cudaGraphExec_t exec = nullptr;
      CUDA_ASSERT(cudaGraphInstantiate(&exec, graph, 0));
      poison();
      CUDA_ASSERT(cudaGraphLaunch(exec, st.s));
      ASSERT_NO_FATAL_FAILURE(fetch_and_check("graph replay"));
      cudaGraphExecDestroy(exec);
      cudaGraphDestroy(graph);
    }
}

// Without a workspace, a stream whose library buffer is too small cannot be captured: the call
// says to pass one, and leaves the capture intact.
TEST(CudaRuntime, GraphCaptureWithoutWorkspaceIsAnError) {
  QSDPA_REQUIRE_CUDA();
  Stream st;  // a fresh stream: the library holds no buffer for it yet
  test::Problem h(decode_case(5));
  test::DeviceProblem d(h);
  AttentionParams p = d.params();
  p.stream = st.s;
  cudaGraph_t graph = nullptr;
  CUDA_ASSERT(cudaStreamBeginCapture(st.s, cudaStreamCaptureModeGlobal));
  const Status s = attention(p);
  const cudaError_t end = cudaStreamEndCapture(st.s, &graph);
  EXPECT_EQ(s.code, StatusCode::invalid_argument);
  EXPECT_NE(s.message.find("workspace"), std::string::npos) << s.message;
  EXPECT_EQ(end, cudaSuccess) << cudaGetErrorString(end);
  if (graph) cudaGraphDestroy(graph);
}

// Two streams at once, each with its own library workspace.
TEST(CudaRuntime, ConcurrentStreams) {
  QSDPA_REQUIRE_CUDA();
  Stream s1, s2;
  Case c1 = decode_case(6), c2 = decode_case(7);
  c2.dtype = DType::bf16, c2.N = 4500, c2.D = 64;
  test::Problem h1(c1), h2(c2);
  test::DeviceProblem d1(h1), d2(h2);
  AttentionParams p1 = d1.params(), p2 = d2.params();
  p1.stream = s1.s, p2.stream = s2.s;
  for (int round = 0; round < 3; ++round) {
    d1.poison(), d2.poison();
    ASSERT_TRUE(attention(p1).ok());
    ASSERT_TRUE(attention(p2).ok());
    ASSERT_EQ(d1.fetch(), "");
    ASSERT_EQ(d2.fetch(), "");
    EXPECT_EQ(d1.check(), "") << "round " << round;
    EXPECT_EQ(d2.check(), "") << "round " << round;
  }
}

TEST(CudaRuntime, HostMemoryIsRejected) {
  QSDPA_REQUIRE_CUDA();
  int pageable = 0;
  CUDA_ASSERT(cudaDeviceGetAttribute(&pageable, cudaDevAttrPageableMemoryAccess, 0));
  if (pageable) GTEST_SKIP() << "this device reads pageable host memory";
  test::Problem h(decode_case(8));
  test::DeviceProblem d(h);
  AttentionParams p = d.params();
  p.k.scales = h.k.scales.data();  // host memory
  const Status s = attention(p);
  EXPECT_EQ(s.code, StatusCode::invalid_argument);
  EXPECT_NE(s.message.find("k.scales"), std::string::npos) << s.message;
  ASSERT_EQ(d.fetch(), "");
  EXPECT_TRUE(all_bytes(h.out, 0xff)) << "out was written by a failing call";
}

// The bench's --cold-l2 reader (tools/exec.cpp): it must read every word it is given, the 16-byte
// pieces and the tail, and nothing past them, or the cache it leaves is not the one described.
TEST(CudaRuntime, ReadThroughL2SumsEveryWord) {
  QSDPA_REQUIRE_CUDA();
  Stream st;
  // sizes: under one piece, pieces and tails of 1-3 words, several grid strides' worth (the grid
  // is at most 1024 blocks of 512 threads)
  for (const size_t words : {size_t(1), size_t(3), size_t(4096 + 1), size_t(4096 + 2), size_t(4096 + 3),
                             size_t(5) << 20}) {
    std::vector<uint32_t> h(words + 4);
    uint32_t want = 0;
    for (size_t i = 0; i < h.size(); ++i) {
      h[i] = uint32_t(i * 2654435761u + 12345u);
      if (i < words) want += h[i];  // (the 4 words past the end must not count)
    }
    const test::DeviceBuffer db(h), sb(4);
    uint32_t* d = db.as<uint32_t>();
    uint32_t* sum = sb.as<uint32_t>();
    // (on the call's stream: st.s does not wait for the legacy default stream, so a plain
    // cudaMemset could land after the call's own zeroing; run 106 saw that as a sum one short)
    CUDA_ASSERT(cudaMemsetAsync(sum, 0xff, 4, st.s));  // (the call zeroes it first)
    const Status s = cuda::read_through_l2(d, words * 4, sum, st.s);
    ASSERT_TRUE(s.ok()) << s.message;
    CUDA_ASSERT(cudaStreamSynchronize(st.s));
    uint32_t got = 0;
    CUDA_ASSERT(cudaMemcpy(&got, sum, 4, cudaMemcpyDeviceToHost));
    EXPECT_EQ(got, want) << words << " words";
    // not 16-byte aligned, or not whole words: refused
    EXPECT_EQ(cuda::read_through_l2(d + 1, 16, sum, st.s).code, StatusCode::invalid_argument);
    EXPECT_EQ(cuda::read_through_l2(d, 6, sum, st.s).code, StatusCode::invalid_argument);
  }
}
