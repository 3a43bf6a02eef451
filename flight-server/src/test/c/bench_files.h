/*
 * What the C-only benchmarks here share: the CPU time of the calling thread, and every file a glob matches read
 * into memory (a file that cannot be read, or no match, ends the program with a message naming it).
 */
#ifndef UNSTALL_BENCH_FILES_H
#define UNSTALL_BENCH_FILES_H

#include <glob.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double thread_cpu_seconds(void) {
  struct timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

/* The files matching pattern, in glob's order: their names in *files, contents in the result, sizes in *len. */
static uint8_t **read_files(const char *pattern, glob_t *files, long **len) {
  if (glob(pattern, 0, NULL, files) != 0 || files->gl_pathc == 0) {
    fprintf(stderr, "no files match %s\n", pattern);
    exit(2);
  }
  size_t n = files->gl_pathc;
  uint8_t **data = malloc(sizeof *data * n);
  *len = malloc(sizeof **len * n);
  for (size_t i = 0; i < n; i++) {
    const char *path = files->gl_pathv[i];
    FILE *f = fopen(path, "rb");
    long size = -1;
    if (f == NULL || fseek(f, 0, SEEK_END) != 0 || (size = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0
        || (data[i] = malloc((size_t)size + 1)) == NULL || fread(data[i], 1, (size_t)size, f) != (size_t)size) {
      fprintf(stderr, "cannot read %s\n", path);
      exit(1);
    }
    fclose(f);
    (*len)[i] = size;
  }
  return data;
}

#endif
