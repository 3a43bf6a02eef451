/*
 * A C-only benchmark of the native JPEG prep (src/main/c/unstall_jpeg.c, compiled into this file): images per
 * CPU-second of one thread over a directory's JPEGs, RandomResizedCrop 224 boxes (torchvision's scale and ratio
 * ranges, a fixed seed, so every build sees the same crops), random flip, uint8 output alternating NCHW/NHWC.
 * It prints a hash of every output byte: two builds (or the AVX2 and scalar passes, third argument 1 or 0) that
 * print the same hash produced the same bytes. Build and run with flight-server/src/test/c/native_prep_bench.sh.
 * Not a test: the JVM is left out so that changes to the C code can be compared without its noise.
 */
#include UNSTALL_JPEG_C

#include "bench_files.h"

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s 'GLOB' REPEATS [AVX2 1|0]\n", argv[0]);
    return 2;
  }
  glob_t files;
  long *len;
  uint8_t **data = read_files(argv[1], &files, &len);
  int n = (int)files.gl_pathc, repeats = atoi(argv[2]);
#ifdef HAVE_AVX2_PATH
  __builtin_cpu_init();
  use_avx2 = __builtin_cpu_supports("avx2") && (argc < 4 || atoi(argv[3]) != 0);
#endif
  /* REINDEX_SPAN=<pixels>: first rewrite every file with reindex() (restart intervals of at most that span) and
     bench the splice path on the results; the output hash must not change. */
  const char *span = getenv("REINDEX_SPAN");
  if (span != NULL) {
    error_mgr err;
    long before = 0, after = 0;
    double t0 = thread_cpu_seconds();
    for (int i = 0; i < n; i++) {
      unsigned char *out = NULL;
      unsigned long out_len = 0;
      if (reindex(&err, data[i], (size_t)len[i], atoi(span), &out, &out_len) != OK) {
        fprintf(stderr, "%s: not reindexed: %s\n", files.gl_pathv[i], err.message);
        return 1;
      }
      before += len[i];
      after += (long)out_len;
      data[i] = out;
      len[i] = (long)out_len;
    }
    printf("reindexed %d files at %.1f per CPU-second, %ld -> %ld bytes (%.3fx)\n", n,
           n / (thread_cpu_seconds() - t0), before, after, after / (double)before);
  }
  int *dims = malloc(sizeof *dims * 2 * n); /* the header's size, as the Java side passes it */
  for (int i = 0; i < n; i++) {
    struct jpeg_decompress_struct h;
    struct jpeg_error_mgr e;
    h.err = jpeg_std_error(&e);
    jpeg_create_decompress(&h);
    jpeg_mem_src(&h, data[i], (unsigned long)len[i]);
    jpeg_read_header(&h, TRUE);
    dims[i * 2] = (int)h.image_width;
    dims[i * 2 + 1] = (int)h.image_height;
    jpeg_destroy_decompress(&h);
  }
  scratch *s = calloc(1, sizeof *s);
  enum { OUT = 224 };
  static uint8_t dst[3 * OUT * OUT];
  uint64_t hash = 1469598103934665603ULL;
  srand(42);
  double cpu = 0;
  for (int r = 0; r < repeats; r++) {
    for (int i = 0; i < n; i++) {
      int width = dims[i * 2], height = dims[i * 2 + 1];
      double area = width * (double)height * (0.08 + 0.92 * rand() / (double)RAND_MAX);
      double ratio = exp(log(3.0 / 4) + (log(4.0 / 3) - log(3.0 / 4)) * rand() / (double)RAND_MAX);
      int w = (int)round(sqrt(area * ratio)), h = (int)round(sqrt(area / ratio));
      w = w > width ? width : w;
      h = h > height ? height : h;
      int x = rand() % (width - w + 1), y = rand() % (height - h + 1);
      jint geom[13] = {width, height, x, y, x + w, y + h, OUT, OUT, rand() & 1, (r + i) & 1, 1, 8, 1};
      jdouble box[5] = {x, y, x + w, y + h, 2.0};
      double t0 = thread_cpu_seconds();
      int rc = prep(NULL, s, data[i], (int)len[i], dst, NULL, geom, box);
      cpu += thread_cpu_seconds() - t0;
      if (rc != OK) {
        fprintf(stderr, "%s: not prepared\n", files.gl_pathv[i]);
        return 1;
      }
      for (size_t k = 0; k < sizeof dst; k++) {
        hash = (hash ^ dst[k]) * 1099511628211ULL;
      }
    }
  }
  printf("%.1f images per CPU-second (%d images), output hash %016llx\n", n * (double)repeats / cpu, n * repeats,
         (unsigned long long)hash);
  return 0;
}
