// Metal Shading Language on CPU threads: enough of MSL to compile the indexer's Metal kernels,
// exactly as MLX's metal_kernel wraps them, with g++ and run them on one CPU thread.
//
// One fiber (a ucontext) per Metal thread; the threads of one threadgroup run together,
// switching at barriers, threadgroups one after another. threadgroup_barrier is a barrier over
// the group; a SIMD-group (32
// lanes, Apple's width) exchanges values through per-lane slots between two barriers of its
// own. A thread that returns drops out of both barriers, and a barrier or SIMD function reached
// after some of its group (or SIMD-group) returned stops the program: on a GPU that is a
// divergent barrier. Address spaces: `device` and `thread` are plain memory; `constant` is
// `volatile`, so a constant-space buffer handed to a `device` pointer fails to compile, as it
// does in Metal; `threadgroup` arrays become function statics (the including file defines
// `threadgroup` as `static` for kernel bodies, empty for parameters). simdgroup_matrix holds
// each lane's two elements where MLX's BaseMMAFrag::get_coord puts them.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

#include <sys/mman.h>
#include <ucontext.h>

typedef unsigned char uchar;
typedef unsigned short ushort;
typedef unsigned int uint;
typedef unsigned long ulong;
typedef _Float16 half;
typedef half float16_t;

constexpr half operator""h(long double v) { return half(v); }

namespace metal {

template <class T, int N>
struct vec_storage;
template <class T>
struct vec_storage<T, 2> { T x, y; };
template <class T>
struct vec_storage<T, 3> { T x, y, z; };
template <class T>
struct vec_storage<T, 4> { T x, y, z, w; };

// Metal's vector types: 3-vectors are padded to the size and alignment of 4.
template <class T, int N>
struct alignas(sizeof(T) * (N == 3 ? 4 : N)) vec : vec_storage<T, N> {
  vec() = default;
  vec(T s) {
    for (int i = 0; i < N; ++i) (*this)[i] = s;
  }
  template <class... A, class = std::enable_if_t<sizeof...(A) == N && (N > 1)>>
  vec(A... a) {
    const T v[N] = {T(a)...};
    for (int i = 0; i < N; ++i) (*this)[i] = v[i];
  }
  template <class U>
  explicit vec(const vec<U, N>& o) {
    for (int i = 0; i < N; ++i) (*this)[i] = T(o[i]);
  }
  T& operator[](int i) { return (&this->x)[i]; }
  const T& operator[](int i) const { return (&this->x)[i]; }
};

#define STOKE_METAL_VECTORS(T, name) \
  typedef vec<T, 2> name##2;         \
  typedef vec<T, 3> name##3;         \
  typedef vec<T, 4> name##4;
STOKE_METAL_VECTORS(float, float)
STOKE_METAL_VECTORS(half, half)
STOKE_METAL_VECTORS(int, int)
STOKE_METAL_VECTORS(uint, uint)
STOKE_METAL_VECTORS(short, short)
STOKE_METAL_VECTORS(ushort, ushort)
STOKE_METAL_VECTORS(ulong, ulong)
#undef STOKE_METAL_VECTORS

// Scalars by value, so a `constant` (volatile) operand deduces like any other.
template <class T>
T max(T a, T b) { return a < b ? b : a; }
template <class T>
T min(T a, T b) { return b < a ? b : a; }
inline float fma(float a, float b, float c) { return std::fma(a, b, c); }

template <class T, int N>
vec<T, N> max(vec<T, N> a, vec<T, N> b) {
  for (int i = 0; i < N; ++i) a[i] = max(a[i], b[i]);
  return a;
}
template <class T, int N>
vec<T, N> fma(vec<T, N> a, vec<T, N> b, vec<T, N> c) {
  for (int i = 0; i < N; ++i) a[i] = fma(a[i], b[i], c[i]);
  return a;
}
template <class T, int N>
T dot(vec<T, N> a, vec<T, N> b) {
  T sum = a[0] * b[0];
  for (int i = 1; i < N; ++i) sum += a[i] * b[i];
  return sum;
}

template <class To, class From>
To as_type(From from) {
  static_assert(sizeof(To) == sizeof(From), "as_type needs types of one size");
  To to;
  std::memcpy(&to, &from, sizeof(To));
  return to;
}

enum class mem_flags { mem_none = 0, mem_device = 1, mem_threadgroup = 2, mem_texture = 4 };

}  // namespace metal

using namespace metal;

namespace stoke_metal {

constexpr int kSimdWidth = 32;
constexpr int kSlotBytes = 32;  // the largest value one lane hands to a SIMD-group exchange

[[noreturn]] inline void fail(const char* what) {
  std::fprintf(stderr, "metal_on_cpu: %s\n", what);
  std::fflush(stderr);
  std::_Exit(3);
}

// The attributes MLX's metal_kernel may pass ([[thread_position_in_grid]] and the rest).
struct Position {
  uint dispatch_quadgroups_per_threadgroup, dispatch_simdgroups_per_threadgroup;
  uint3 dispatch_threads_per_threadgroup, grid_origin, grid_size;
  uint quadgroup_index_in_threadgroup, quadgroups_per_threadgroup;
  uint simdgroup_index_in_threadgroup, simdgroups_per_threadgroup, thread_execution_width;
  uint thread_index_in_quadgroup, thread_index_in_simdgroup, thread_index_in_threadgroup;
  uint3 thread_position_in_grid, thread_position_in_threadgroup, threadgroup_position_in_grid;
  uint3 threadgroups_per_grid, threads_per_grid;
  uint threads_per_simdgroup;
  uint3 threads_per_threadgroup;
};

// The fibers of one threadgroup on one OS thread: each Metal thread runs on a ucontext of its
// own, until it reaches a barrier it must wait at or returns; the scheduler then resumes the
// next. Cooperative switching instead of an OS thread per Metal thread: a group of 1024
// threads is 1024 context switches per barrier, not 1024 threads fighting over two cores.
struct Scheduler {
  ucontext_t main{};
  std::vector<ucontext_t> fibers;
  std::vector<char> done;
  int current = 0;
  long progress = 0;  // barrier phases completed and threads ended: a pass without any is a hang
};
inline Scheduler scheduler;

inline void yield() {
  swapcontext(&scheduler.fibers[size_t(scheduler.current)], &scheduler.main);
}

// A barrier that stops the program when a phase completes with some threads waiting and
// others already returned: those never reach it (a divergent barrier on a GPU). A thread that
// returns arrives for the phase under way and is no longer expected in the next ones (as
// std::barrier's arrive_and_drop).
struct Barrier {
  Barrier(int n, const char* what) : pending(n), expected(n), what(what) {}
  void wait() {
    ++waiting;
    const long phase = generation;
    if (--pending == 0) return complete();
    while (generation == phase) yield();
  }
  void leave() {
    ++returned;
    --expected;
    if (--pending == 0) complete();
  }
  void complete() {
    if (waiting && returned) fail(what);
    waiting = 0;
    pending = expected;
    ++generation;
    ++scheduler.progress;
  }
  int pending, expected;
  int waiting = 0, returned = 0;
  long generation = 0;
  const char* what;
};

struct Group {
  explicit Group(int n)
      : size(n),
        all(n, "threadgroup_barrier was reached after other threads of the group returned"),
        slots(size_t(n) * kSlotBytes) {
    for (int s = 0; s * kSimdWidth < n; ++s)
      simd.emplace_back(new Barrier(std::min(kSimdWidth, n - s * kSimdWidth),
                                    "a SIMD-group function was reached after other lanes of "
                                    "the SIMD-group returned"));
  }
  int size;
  Barrier all;
  std::vector<std::unique_ptr<Barrier>> simd;
  std::vector<unsigned char> slots;
};

struct Self {
  Group* group;
  int tid;
};
inline Self self;  // the running fiber's: the scheduler sets it before each switch

inline void simd_sync() { self.group->simd[self.tid / kSimdWidth]->wait(); }

inline int simd_lanes() {
  const int base = self.tid / kSimdWidth * kSimdWidth;
  return std::min(kSimdWidth, self.group->size - base);
}

// Every lane's value of `mine`, in lane order (a collective: all lanes must call it).
template <class T>
std::array<T, kSimdWidth> simd_gather(const T& mine) {
  static_assert(sizeof(T) <= kSlotBytes && std::is_trivially_copyable_v<T>);
  unsigned char* slots = self.group->slots.data();
  std::memcpy(slots + size_t(self.tid) * kSlotBytes, &mine, sizeof(T));
  simd_sync();
  std::array<T, kSimdWidth> all{};
  const int base = self.tid / kSimdWidth * kSimdWidth;
  for (int i = 0; i < simd_lanes(); ++i)
    std::memcpy(&all[i], slots + size_t(base + i) * kSlotBytes, sizeof(T));
  simd_sync();
  return all;
}

inline int lane_id() { return self.tid % kSimdWidth; }

// Each fiber's stack: kernels keep their `thread` arrays there. Reserved once, touched only
// as deep as a kernel goes.
constexpr size_t kStackBytes = size_t(1) << 20;
inline char* stacks(int n) {
  static char* base = nullptr;
  if (base == nullptr) {
    void* got = mmap(nullptr, kStackBytes * 1024, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
    if (got == MAP_FAILED) fail("no memory for the threads' stacks");
    base = static_cast<char*>(got);
  }
  return n <= 1024 ? base : nullptr;
}

// The fibers' entry (makecontext passes no pointer portably): runs the current thread's body
// through the dispatch's type-erased call, then drops it from its group's barriers.
inline const void* running_body = nullptr;
inline void (*run_body)(const void*, int) = nullptr;
inline void fiber_entry() {
  const int tid = scheduler.current;
  Group* group = self.group;
  run_body(running_body, tid);
  group->simd[size_t(tid / kSimdWidth)]->leave();
  group->all.leave();
  scheduler.done[size_t(tid)] = 1;
  ++scheduler.progress;
}

// Runs a group's n threads to their ends, each up to its next wait in turn.
inline void run_group(Group& group, int n) {
  char* stack = stacks(n);
  scheduler.fibers.assign(size_t(n), ucontext_t{});
  scheduler.done.assign(size_t(n), 0);
  for (int t = 0; t < n; ++t) {
    ucontext_t& fiber = scheduler.fibers[size_t(t)];
    getcontext(&fiber);
    fiber.uc_stack.ss_sp = stack + size_t(t) * kStackBytes;
    fiber.uc_stack.ss_size = kStackBytes;
    fiber.uc_link = &scheduler.main;
    makecontext(&fiber, fiber_entry, 0);
  }
  for (int alive = n; alive > 0;) {
    const long before = scheduler.progress;
    for (int t = 0; t < n; ++t) {
      if (scheduler.done[size_t(t)]) continue;
      scheduler.current = t;
      self = {&group, t};
      swapcontext(&scheduler.main, &scheduler.fibers[size_t(t)]);
      if (scheduler.done[size_t(t)]) --alive;
    }
    if (alive > 0 && scheduler.progress == before)
      fail("the threads of a group wait at different barriers and none can go on");
  }
}

// MTLComputeCommandEncoder dispatchThreads: `grid` counts threads, groups at the far edges
// may be partial (MLX passes min(threadgroup, grid) per dimension as the group size).
template <class Body>
void dispatch_threads(uint3 grid, uint3 group_size, const Body& body) {
  uint3 tg;
  for (int d = 0; d < 3; ++d) tg[d] = std::min(group_size[d], grid[d]);
  if (tg.x * tg.y * tg.z > 1024) fail("more than 1024 threads per threadgroup");
  uint3 groups;
  for (int d = 0; d < 3; ++d) groups[d] = tg[d] ? (grid[d] + tg[d] - 1) / tg[d] : 0;
  for (uint gz = 0; gz < groups.z; ++gz)
    for (uint gy = 0; gy < groups.y; ++gy)
      for (uint gx = 0; gx < groups.x; ++gx) {
        const uint3 gpos(gx, gy, gz);
        uint3 actual;
        for (int d = 0; d < 3; ++d) actual[d] = std::min(tg[d], grid[d] - gpos[d] * tg[d]);
        const int n = int(actual.x * actual.y * actual.z);
        std::vector<Position> positions(static_cast<size_t>(n));
        for (int t = 0; t < n; ++t) {
          Position& p = positions[size_t(t)];
          p.thread_position_in_threadgroup =
              uint3(t % actual.x, t / actual.x % actual.y, t / (actual.x * actual.y));
          p.threadgroup_position_in_grid = gpos;
          for (int d = 0; d < 3; ++d)
            p.thread_position_in_grid[d] = gpos[d] * tg[d] + p.thread_position_in_threadgroup[d];
          p.thread_index_in_threadgroup = t;
          p.simdgroup_index_in_threadgroup = t / kSimdWidth;
          p.thread_index_in_simdgroup = t % kSimdWidth;
          p.quadgroup_index_in_threadgroup = t / 4;
          p.thread_index_in_quadgroup = t % 4;
          p.simdgroups_per_threadgroup = (n + kSimdWidth - 1) / kSimdWidth;
          p.quadgroups_per_threadgroup = (n + 3) / 4;
          p.dispatch_threads_per_threadgroup = tg;
          p.dispatch_simdgroups_per_threadgroup = (tg.x * tg.y * tg.z + kSimdWidth - 1) / kSimdWidth;
          p.dispatch_quadgroups_per_threadgroup = (tg.x * tg.y * tg.z + 3) / 4;
          p.threads_per_threadgroup = actual;
          p.threadgroups_per_grid = groups;
          p.threads_per_grid = grid;
          p.grid_size = grid;
          p.grid_origin = uint3(0u);
          p.thread_execution_width = kSimdWidth;
          p.threads_per_simdgroup = kSimdWidth;
        }
        struct Call {
          const Body& body;
          const std::vector<Position>& positions;
        } call{body, positions};
        running_body = &call;
        run_body = [](const void* c, int t) {
          const Call& it = *static_cast<const Call*>(c);
          it.body(it.positions[size_t(t)]);
        };
        Group group(n);
        run_group(group, n);
      }
}

// Lane `lane`'s place in an 8x8 simdgroup_matrix: row, and the first of its two columns
// (MLX's BaseMMAFrag::get_coord).
inline void fragment_coord(int lane, int& row, int& col) {
  const int qid = lane / 4;
  row = (qid & 4) + (lane / 2) % 4;
  col = (qid & 2) * 2 + (lane % 2) * 2;
}

}  // namespace stoke_metal

namespace metal {

inline void threadgroup_barrier(mem_flags) { stoke_metal::self.group->all.wait(); }

template <class T>
T simd_sum(T x) {
  const auto all = stoke_metal::simd_gather(x);
  T sum = all[0];
  for (int i = 1; i < stoke_metal::simd_lanes(); ++i) sum += all[i];
  return sum;
}
template <class T>
T simd_max(T x) {
  const auto all = stoke_metal::simd_gather(x);
  T best = all[0];
  for (int i = 1; i < stoke_metal::simd_lanes(); ++i) best = max(best, all[i]);
  return best;
}
template <class T>
T simd_min(T x) {
  const auto all = stoke_metal::simd_gather(x);
  T best = all[0];
  for (int i = 1; i < stoke_metal::simd_lanes(); ++i) best = min(best, all[i]);
  return best;
}
template <class T>
T simd_prefix_exclusive_sum(T x) {
  const auto all = stoke_metal::simd_gather(x);
  T sum = T(0);
  for (int i = 0; i < stoke_metal::lane_id(); ++i) sum += all[i];
  return sum;
}
template <class T>
T simd_prefix_inclusive_sum(T x) {
  return simd_prefix_exclusive_sum(x) + x;
}
template <class T>
T simd_shuffle(T x, ushort lane) {
  return stoke_metal::simd_gather(x)[lane % stoke_metal::kSimdWidth];
}
template <class T>
T simd_broadcast(T x, ushort lane) {
  return simd_shuffle(x, lane);
}
template <class T>
T simd_shuffle_xor(T x, ushort mask) {
  return stoke_metal::simd_gather(x)[(stoke_metal::lane_id() ^ mask) % stoke_metal::kSimdWidth];
}
// Lanes whose source lies outside the SIMD-group keep their own value.
template <class T>
T simd_shuffle_down(T x, ushort delta) {
  const auto all = stoke_metal::simd_gather(x);
  const int from = stoke_metal::lane_id() + delta;
  return from < stoke_metal::simd_lanes() ? all[from] : x;
}
template <class T>
T simd_shuffle_up(T x, ushort delta) {
  const auto all = stoke_metal::simd_gather(x);
  const int from = stoke_metal::lane_id() - delta;
  return from >= 0 ? all[from] : x;
}

// An 8x8 matrix spread over the 32 lanes of a SIMD-group, two elements per lane.
template <class T, int Cols, int Rows>
struct simdgroup_matrix {
  static_assert(Cols == 8 && Rows == 8, "only 8x8 simdgroup matrices are emulated");
  vec<T, 2> elements;
  vec<T, 2>& thread_elements() { return elements; }
  const vec<T, 2>& thread_elements() const { return elements; }
};

template <class T, int Cols, int Rows>
simdgroup_matrix<T, Cols, Rows> make_filled_simdgroup_matrix(T value) {
  simdgroup_matrix<T, Cols, Rows> m;
  m.elements = vec<T, 2>(value);
  return m;
}

// d(r, c) = src[r * elements_per_row + c], or src[c * elements_per_row + r] transposed. Only
// pointers to device or threadgroup memory are accepted (a constant one does not bind).
template <class T>
void simdgroup_load(simdgroup_matrix<T, 8, 8>& d, const T* src, ulong elements_per_row = 8,
                    ulong2 matrix_origin = ulong2(0ul), bool transpose_matrix = false) {
  if (matrix_origin.x || matrix_origin.y) stoke_metal::fail("simdgroup_load: matrix_origin != 0");
  int row, col;
  stoke_metal::fragment_coord(stoke_metal::lane_id(), row, col);
  for (int i = 0; i < 2; ++i) {
    const ulong at = transpose_matrix ? ulong(col + i) * elements_per_row + row
                                      : ulong(row) * elements_per_row + col + i;
    d.elements[i] = src[at];
  }
}

template <class T>
void simdgroup_store(const simdgroup_matrix<T, 8, 8>& a, T* dst, ulong elements_per_row = 8,
                     ulong2 matrix_origin = ulong2(0ul), bool transpose_matrix = false) {
  if (matrix_origin.x || matrix_origin.y) stoke_metal::fail("simdgroup_store: matrix_origin != 0");
  int row, col;
  stoke_metal::fragment_coord(stoke_metal::lane_id(), row, col);
  for (int i = 0; i < 2; ++i) {
    const ulong at = transpose_matrix ? ulong(col + i) * elements_per_row + row
                                      : ulong(row) * elements_per_row + col + i;
    dst[at] = a.elements[i];
  }
}

// d = a * b + c, every product and sum in fp32 (k ascending, then + c).
template <class TD, class TA, class TB, class TC>
void simdgroup_multiply_accumulate(simdgroup_matrix<TD, 8, 8>& d,
                                   const simdgroup_matrix<TA, 8, 8>& a,
                                   const simdgroup_matrix<TB, 8, 8>& b,
                                   const simdgroup_matrix<TC, 8, 8>& c) {
  struct Pair {
    vec<TA, 2> a;
    vec<TB, 2> b;
  };
  if (stoke_metal::simd_lanes() != stoke_metal::kSimdWidth)
    stoke_metal::fail("simdgroup_multiply_accumulate needs a full SIMD-group of 32 lanes");
  const auto all = stoke_metal::simd_gather(Pair{a.elements, b.elements});
  float ma[8][8], mb[8][8];
  for (int lane = 0; lane < stoke_metal::kSimdWidth; ++lane) {
    int row, col;
    stoke_metal::fragment_coord(lane, row, col);
    for (int i = 0; i < 2; ++i) {
      ma[row][col + i] = float(all[lane].a[i]);
      mb[row][col + i] = float(all[lane].b[i]);
    }
  }
  int row, col;
  stoke_metal::fragment_coord(stoke_metal::lane_id(), row, col);
  vec<TD, 2> out;
  for (int i = 0; i < 2; ++i) {
    float sum = 0.0f;
    for (int k = 0; k < 8; ++k) sum += ma[row][k] * mb[k][col + i];
    out[i] = TD(sum + float(c.elements[i]));
  }
  d.elements = out;
}

}  // namespace metal

// Address spaces last, so the std headers above never see them.
#define device
#define thread
#define constant volatile
#define threadgroup
