// write_fault: a preload library (LD_PRELOAD) that makes writes to chosen files fail the way a full disk, a quota
// or a read-only file system does, under the real program and the real HDF5 library. The tests use it to stop a
// `proplab run` at a chosen point (during a record, a checkpoint or the run file's finalisation) and check what the
// run leaves behind.
//
// Configured by the environment (nothing happens when PROPLAB_FAULT_FILE is unset):
//   PROPLAB_FAULT_FILE         writes to a file whose path ends with this text fail (write, pwrite, pwrite64)
//   PROPLAB_FAULT_ERRNO        the errno they fail with (default 28, ENOSPC)
//   PROPLAB_FAULT_ARM_RENAME   armed only after this many rename()s onto a path ending with
//   PROPLAB_FAULT_ARM_SUFFIX   (default ".ckpt.h5": a committed checkpoint); default 0: armed from the start
//   PROPLAB_FAULT_SKIP         once armed, this many writes to the file still succeed before the first fails
//   PROPLAB_FAULT_WRITES       how many writes fail then (default: all of them, a disk that stays full)
// Each failing write prints nothing; the program sees -1 and errno, as from the kernel.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

typedef ssize_t (*write_fn)(int, const void*, size_t);
typedef ssize_t (*pwrite_fn)(int, const void*, size_t, off_t);
typedef int (*rename_fn)(const char*, const char*);

static long renames_seen = 0;
static long writes_skipped = 0;
static long writes_failed = 0;

static long env_long(const char* name, long fallback) {
  const char* text = getenv(name);
  return text != NULL && *text != '\0' ? strtol(text, NULL, 10) : fallback;
}

static bool ends_with(const char* text, const char* suffix) {
  const size_t length = strlen(text), suffix_length = strlen(suffix);
  return suffix_length <= length && strcmp(text + length - suffix_length, suffix) == 0;
}

// Whether this write to `fd` must fail; sets errno when it must.
static bool should_fail(int fd) {
  const char* target = getenv("PROPLAB_FAULT_FILE");
  if (target == NULL || *target == '\0') return false;
  if (renames_seen < env_long("PROPLAB_FAULT_ARM_RENAME", 0)) return false;
  const long budget = env_long("PROPLAB_FAULT_WRITES", -1);
  if (budget >= 0 && writes_failed >= budget) return false;
  char link[64], path[4096];
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  const ssize_t length = readlink(link, path, sizeof path - 1);
  if (length <= 0) return false;
  path[length] = '\0';
  if (!ends_with(path, target)) return false;
  if (writes_skipped < env_long("PROPLAB_FAULT_SKIP", 0)) {
    ++writes_skipped;
    return false;
  }
  ++writes_failed;
  errno = (int)env_long("PROPLAB_FAULT_ERRNO", ENOSPC);
  return true;
}

ssize_t write(int fd, const void* buffer, size_t count) {
  static write_fn real = NULL;
  if (real == NULL) real = (write_fn)dlsym(RTLD_NEXT, "write");
  if (should_fail(fd)) return -1;
  return real(fd, buffer, count);
}

ssize_t pwrite(int fd, const void* buffer, size_t count, off_t offset) {
  static pwrite_fn real = NULL;
  if (real == NULL) real = (pwrite_fn)dlsym(RTLD_NEXT, "pwrite");
  if (should_fail(fd)) return -1;
  return real(fd, buffer, count, offset);
}

ssize_t pwrite64(int fd, const void* buffer, size_t count, off_t offset) {
  static pwrite_fn real = NULL;
  if (real == NULL) real = (pwrite_fn)dlsym(RTLD_NEXT, "pwrite64");
  if (should_fail(fd)) return -1;
  return real(fd, buffer, count, offset);
}

int rename(const char* from, const char* to) {
  static rename_fn real = NULL;
  if (real == NULL) real = (rename_fn)dlsym(RTLD_NEXT, "rename");
  const int result = real(from, to);
  const char* suffix = getenv("PROPLAB_FAULT_ARM_SUFFIX");
  if (result == 0 && ends_with(to, suffix != NULL && *suffix != '\0' ? suffix : ".ckpt.h5")) ++renames_seen;
  return result;
}
