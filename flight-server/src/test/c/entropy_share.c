/*
 * How much of a whole-image decode is entropy (Huffman) decoding, on a directory's JPEGs, with the system's
 * libjpeg-turbo: one thread, images per CPU-second of that thread, for
 *   full     every row decoded to RGB (what tjbench times),
 *   entropy  jpeg_skip_scanlines over every row but the last: entropy decoding only, the coefficients discarded,
 *   strip    a 16-pixel-wide crop (jpeg_crop_scanline) of every row: entropy decoding inside
 *            jpeg_read_scanlines (coefficients stored, then discarded outside the crop), next to no IDCT,
 * alternated round by round. A crop window cannot skip the entropy decoding of the rows above its bottom edge or
 * of the columns beside it (docs/PREP.md). Build and run with entropy_share.sh.
 */
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
/* jpeglib.h needs FILE from stdio.h first */
#include <jpeglib.h>
#include <time.h>

static double cpu(void) {
  struct timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s 'GLOB' ROUNDS\n", argv[0]);
    return 2;
  }
  glob_t g;
  if (glob(argv[1], 0, NULL, &g) != 0 || g.gl_pathc == 0) {
    fprintf(stderr, "no files match %s\n", argv[1]);
    return 2;
  }
  int n = (int)g.gl_pathc, rounds = atoi(argv[2]);
  unsigned char **data = malloc(sizeof *data * n);
  long *len = malloc(sizeof *len * n);
  for (int i = 0; i < n; i++) {
    FILE *f = fopen(g.gl_pathv[i], "rb");
    if (f == NULL || fseek(f, 0, SEEK_END) != 0 || (len[i] = ftell(f)) <= 0 || fseek(f, 0, SEEK_SET) != 0) {
      fprintf(stderr, "cannot read %s\n", g.gl_pathv[i]);
      return 1;
    }
    data[i] = malloc((size_t)len[i]);
    if (fread(data[i], 1, (size_t)len[i], f) != (size_t)len[i]) {
      fprintf(stderr, "cannot read %s\n", g.gl_pathv[i]);
      return 1;
    }
    fclose(f);
  }
  struct jpeg_decompress_struct ci;
  struct jpeg_error_mgr err;
  ci.err = jpeg_std_error(&err);
  jpeg_create_decompress(&ci);
  unsigned char *line = malloc(1 << 20);
  const char *names[] = {"full", "entropy", "strip"};
  double secs[3] = {0, 0, 0};
  for (int r = 0; r < rounds; r++) {
    for (int mode = 0; mode < 3; mode++) {
      double t0 = cpu();
      for (int i = 0; i < n; i++) {
        jpeg_mem_src(&ci, data[i], (unsigned long)len[i]);
        jpeg_read_header(&ci, TRUE);
        ci.out_color_space = JCS_RGB;
        jpeg_start_decompress(&ci);
        if (mode == 2) {
          JDIMENSION x0 = 0, w = 16;
          jpeg_crop_scanline(&ci, &x0, &w);
        } else if (mode == 1) {
          jpeg_skip_scanlines(&ci, ci.output_height - 1);
        }
        while (ci.output_scanline < ci.output_height) {
          JSAMPROW l = line;
          jpeg_read_scanlines(&ci, &l, 1);
        }
        jpeg_abort_decompress(&ci);
      }
      secs[mode] += cpu() - t0;
    }
  }
  for (int mode = 0; mode < 3; mode++) {
    printf("%-8s %7.1f images per CPU-second  (%.2f of full's time)\n", names[mode], n * (double)rounds / secs[mode],
           secs[mode] / secs[0]);
  }
  return 0;
}
