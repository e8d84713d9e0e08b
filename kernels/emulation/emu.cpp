// kernels/emulation/emu.cpp: the emulated GPU's kernel launches — a grid run on the host, one block after another,
// the threads of a block as fibers that meet at __syncthreads(). A fiber switch is a few instructions of assembly
// on x86-64 (callee-saved registers, MXCSR and the x87 control word; no system call); elsewhere, and under
// AddressSanitizer, which must see stack switches, it is ucontext's swapcontext (a signal-mask system call each).
//
// Invariants:
// - Everything runs on the launching thread; the scheduler, its fiber stacks and the kernels' __shared__ arrays
//   are thread-local, so two host threads may launch at the same time.
// - A block runs in phases: each thread that has not returned runs until it reaches a barrier or returns; when all
//   have returned the block is done; when all wait at the same barrier (same __syncthreads in the source) the
//   next phase starts; anything else (some returned while others wait, or threads waiting at different barriers)
//   is a divergent barrier, undefined on a GPU: the process aborts naming the kernel, block, threads and places.
// - Thread 0 of a block runs first, in a fiber. When it returns without reaching a barrier, no other thread of the
//   block may reach one (that would be divergent), so the rest run as plain calls on the scheduler's stack, which
//   is much faster; a barrier there aborts as divergent.
// - Fiber stacks (kStackBytes each, with a guard page below) are made on first use and reused by every block.
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <deque>

#include "kernels/emulation/emu.h"

namespace proplab::emu {

namespace detail {
thread_local constinit uint3 thread_idx{0, 0, 0};
thread_local constinit uint3 block_idx{0, 0, 0};
thread_local constinit dim3 block_dim{1, 1, 1};
thread_local constinit dim3 grid_dim{1, 1, 1};

// Defined with the fake runtime (runtime.cpp): the error cudaGetLastError returns next.
void set_last_error(cudaError_t error);
}  // namespace detail

namespace {

constexpr std::size_t kStackBytes = 256 * 1024;
constexpr std::size_t kMaxSharedBytes = 48 * 1024;
constexpr int kMaxSharedArrays = 64;

enum class State { running, at_barrier, done };

#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__)
#define PROPLAB_EMU_ASM_SWITCH 1
#endif

#ifdef PROPLAB_EMU_ASM_SWITCH
// Saves the callee-saved state on the current stack, stores the stack pointer in *save, continues on `load`.
extern "C" void proplab_emu_switch(void** save, void* load);
asm(R"(
  .text
  .p2align 4
  .globl proplab_emu_switch
  .hidden proplab_emu_switch
  .type proplab_emu_switch, @function
proplab_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size proplab_emu_switch, .-proplab_emu_switch
)");
#endif

struct Fiber {
#ifdef PROPLAB_EMU_ASM_SWITCH
  void* sp = nullptr;  // the saved stack pointer of a suspended fiber
#else
  ucontext_t context{};
#endif
  char* stack = nullptr;  // the usable part, above the guard page
  State state = State::done;
  const char* barrier_file = nullptr;
  int barrier_line = 0;
};

struct SharedArray {
  const void* address;
  std::size_t bytes;
};

[[noreturn]] void die(const char* format, ...) __attribute__((format(printf, 1, 2)));
void die(const char* format, ...) {
  std::fputs("proplab CUDA emulator: ", stderr);
  va_list arguments;
  va_start(arguments, format);
  std::vfprintf(stderr, format, arguments);
  va_end(arguments);
  std::fputc('\n', stderr);
  std::fflush(stderr);
  std::abort();
}

struct Scheduler {
  std::deque<Fiber> fibers;  // a deque: a ucontext_t points into itself, so fibers never move
#ifdef PROPLAB_EMU_ASM_SWITCH
  void* home = nullptr;
#else
  ucontext_t home{};
#endif
  int current = -1;         // the fiber running now; -1 on the scheduler's own stack
  bool direct = false;      // threads run as plain calls (thread 0 returned without a barrier)
  const char* kernel = "";  // the running launch
  detail::Body body = nullptr;
  void* body_context = nullptr;
  SharedArray shared[kMaxSharedArrays]{};
  int shared_count = 0;
  std::size_t shared_bytes = 0;
  std::size_t dynamic_shared = 0;

  ~Scheduler() {
    const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
    for (Fiber& fiber : fibers)
      if (fiber.stack != nullptr) munmap(fiber.stack - page, kStackBytes + page);
  }

  Fiber& fiber(int index) {
    if (static_cast<std::size_t>(index) >= fibers.size()) fibers.resize(static_cast<std::size_t>(index) + 1);
    Fiber& f = fibers[static_cast<std::size_t>(index)];
    if (f.stack == nullptr) {
      const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
      void* memory =
          mmap(nullptr, kStackBytes + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (memory == MAP_FAILED) die("cannot map a fiber stack of %zu bytes", kStackBytes);
      mprotect(memory, page, PROT_NONE);  // a stack overflow faults instead of corrupting the next stack
      f.stack = static_cast<char*>(memory) + page;
#ifndef PROPLAB_EMU_ASM_SWITCH
      if (getcontext(&f.context) != 0) die("getcontext failed");
#endif
    }
    return f;
  }
};

thread_local Scheduler scheduler;

uint3 coordinates(int linear, dim3 block) {
  const unsigned t = static_cast<unsigned>(linear);
  return uint3{t % block.x, (t / block.x) % block.y, t / (block.x * block.y)};
}

// Suspends the running fiber `f` and continues the scheduler.
void switch_home(Scheduler& s, Fiber& f) {
#ifdef PROPLAB_EMU_ASM_SWITCH
  proplab_emu_switch(&f.sp, s.home);
#else
  if (swapcontext(&f.context, &s.home) != 0) die("swapcontext failed");
#endif
}

void fiber_main() {
  Scheduler& s = scheduler;
  s.body(s.body_context);
  Fiber& f = s.fibers[static_cast<std::size_t>(s.current)];
  f.state = State::done;
  switch_home(s, f);
  die("a finished fiber was resumed");
}

// Makes `f` start at fiber_main on its own stack when next switched to.
void prepare(Fiber& f) {
#ifdef PROPLAB_EMU_ASM_SWITCH
  // The frame proplab_emu_switch pops: control words, r15..rbp (zero), then fiber_main as the return address, above
  // it a null fake return address so that fiber_main starts with the stack aligned as after a call.
  auto* top = reinterpret_cast<std::uint64_t*>(f.stack + kStackBytes);
  *--top = 0;
  *--top = reinterpret_cast<std::uint64_t>(&fiber_main);
  for (int r = 0; r < 6; ++r) *--top = 0;
  *--top = 0x1F80u | (std::uint64_t{0x037Fu} << 32);  // MXCSR default, x87 control word default
  f.sp = top;
#else
  f.context.uc_stack.ss_sp = f.stack;
  f.context.uc_stack.ss_size = kStackBytes;
  f.context.uc_link = nullptr;
  makecontext(&f.context, fiber_main, 0);
#endif
}

// Starts (or resumes) fiber `index` as thread `index` of the block; returns when it waits or has returned.
void run_fiber(Scheduler& s, int index, bool start) {
  Fiber& f = s.fibers[static_cast<std::size_t>(index)];
  if (start) prepare(f);
  f.state = State::running;
  detail::thread_idx = coordinates(index, detail::block_dim);
  s.current = index;
#ifdef PROPLAB_EMU_ASM_SWITCH
  proplab_emu_switch(&s.home, f.sp);
#else
  if (swapcontext(&s.home, &f.context) != 0) die("swapcontext failed");
#endif
  s.current = -1;
}

void describe_block(char* out, std::size_t size) {
  std::snprintf(out, size, "block (%u,%u,%u) of grid (%u,%u,%u), blockDim (%u,%u,%u)", detail::block_idx.x,
                detail::block_idx.y, detail::block_idx.z, detail::grid_dim.x, detail::grid_dim.y, detail::grid_dim.z,
                detail::block_dim.x, detail::block_dim.y, detail::block_dim.z);
}

void run_block(Scheduler& s, int threads) {
  for (int t = 0; t < threads; ++t) s.fiber(t);
  run_fiber(s, 0, true);
  if (s.fibers[0].state == State::done) {
    // Thread 0 never waited: neither may any other thread. Run them as plain calls.
    s.direct = true;
    for (int t = 1; t < threads; ++t) {
      detail::thread_idx = coordinates(t, detail::block_dim);
      s.body(s.body_context);
    }
    s.direct = false;
    return;
  }
  for (int t = 1; t < threads; ++t) run_fiber(s, t, true);
  for (;;) {
    int done = 0, waiting = 0, first_done = -1, first_waiting = -1;
    for (int t = 0; t < threads; ++t) {
      const Fiber& f = s.fibers[static_cast<std::size_t>(t)];
      if (f.state == State::done) {
        ++done;
        if (first_done < 0) first_done = t;
      } else {
        ++waiting;
        if (first_waiting < 0) first_waiting = t;
      }
    }
    if (waiting == 0) return;
    char block[160];
    describe_block(block, sizeof block);
    const Fiber& w = s.fibers[static_cast<std::size_t>(first_waiting)];
    if (done > 0) {
      const uint3 a = coordinates(first_done, detail::block_dim), b = coordinates(first_waiting, detail::block_dim);
      die("divergent __syncthreads in kernel %s, %s: thread (%u,%u,%u) returned while thread (%u,%u,%u) waits at "
          "%s:%d (%d of %d threads returned)",
          s.kernel, block, a.x, a.y, a.z, b.x, b.y, b.z, w.barrier_file, w.barrier_line, done, threads);
    }
    for (int t = 0; t < threads; ++t) {
      const Fiber& f = s.fibers[static_cast<std::size_t>(t)];
      if (f.barrier_line != w.barrier_line || f.barrier_file != w.barrier_file) {
        const uint3 a = coordinates(first_waiting, detail::block_dim), b = coordinates(t, detail::block_dim);
        die("divergent __syncthreads in kernel %s, %s: thread (%u,%u,%u) waits at %s:%d, thread (%u,%u,%u) at "
            "%s:%d",
            s.kernel, block, a.x, a.y, a.z, w.barrier_file, w.barrier_line, b.x, b.y, b.z, f.barrier_file,
            f.barrier_line);
      }
    }
    for (int t = 0; t < threads; ++t) run_fiber(s, t, false);
  }
}

// The launch limits of compute capability 9.0; the reason, or null when the configuration is valid.
const char* invalid_configuration(dim3 grid, dim3 block, std::size_t dynamic_shared) {
  if (block.x == 0 || block.y == 0 || block.z == 0) return "a block dimension is 0";
  if (block.x > 1024 || block.y > 1024 || block.z > 64) return "a block dimension exceeds (1024, 1024, 64)";
  if (static_cast<std::uint64_t>(block.x) * block.y * block.z > 1024) return "more than 1024 threads per block";
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return "a grid dimension is 0";
  if (grid.x > 0x7fffffffu) return "gridDim.x exceeds 2^31 - 1";
  if (grid.y > 65535 || grid.z > 65535) return "gridDim.y or gridDim.z exceeds 65535";
  if (dynamic_shared > kMaxSharedBytes) return "more than 48 KiB of dynamic shared memory";
  return nullptr;
}

}  // namespace

namespace detail {

void run_grid(const char* kernel, dim3 grid, dim3 block, std::size_t dynamic_shared, Body body, void* context) {
  Scheduler& s = scheduler;
  if (s.body != nullptr) die("kernel %s launched from inside kernel %s", kernel, s.kernel);
  if (const char* reason = invalid_configuration(grid, block, dynamic_shared)) {
    std::fprintf(stderr,
                 "proplab CUDA emulator: launch of kernel %s with grid (%u,%u,%u), block (%u,%u,%u), %zu bytes of "
                 "dynamic shared memory: invalid configuration: %s\n",
                 kernel, grid.x, grid.y, grid.z, block.x, block.y, block.z, dynamic_shared, reason);
    set_last_error(cudaErrorInvalidConfiguration);
    return;
  }
  s.kernel = kernel;
  s.body = body;
  s.body_context = context;
  s.shared_count = 0;
  s.shared_bytes = 0;
  s.dynamic_shared = dynamic_shared;
  grid_dim = grid;
  block_dim = block;
  const int threads = static_cast<int>(block.x * block.y * block.z);
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        block_idx = uint3{x, y, z};
        run_block(s, threads);
      }
  s.body = nullptr;
  s.kernel = "";
}

}  // namespace detail

void syncthreads(const char* file, int line) {
  Scheduler& s = scheduler;
  if (s.current < 0) {
    if (s.body == nullptr) die("__syncthreads() called outside a kernel (%s:%d)", file, line);
    char block[160];
    describe_block(block, sizeof block);
    die("divergent __syncthreads in kernel %s, %s: thread (0,0,0) returned without reaching a barrier, thread "
        "(%u,%u,%u) reached %s:%d",
        s.kernel, block, detail::thread_idx.x, detail::thread_idx.y, detail::thread_idx.z, file, line);
  }
  Fiber& f = s.fibers[static_cast<std::size_t>(s.current)];
  f.state = State::at_barrier;
  f.barrier_file = file;
  f.barrier_line = line;
  switch_home(s, f);
}

void note_shared(const void* address, std::size_t bytes, const char* name) {
  Scheduler& s = scheduler;
  for (int i = 0; i < s.shared_count; ++i)
    if (s.shared[i].address == address) return;
  if (s.shared_count == kMaxSharedArrays)
    die("kernel %s declares more than %d __shared__ arrays", s.kernel, kMaxSharedArrays);
  s.shared[s.shared_count++] = SharedArray{address, bytes};
  s.shared_bytes += bytes;
  if (s.shared_bytes + s.dynamic_shared > kMaxSharedBytes)
    die("kernel %s uses %zu bytes of static shared memory (with __shared__ %s of %zu bytes) plus %zu dynamic: more "
        "than the 48 KiB a block may have without opting in",
        s.kernel, s.shared_bytes, name, bytes, s.dynamic_shared);
}

}  // namespace proplab::emu
