/*
 * How much of a whole-image decode is entropy (Huffman) decoding, on a directory's JPEGs, with the system's
 * libjpeg-turbo: one thread, images per CPU-second of that thread, for
 *   full     every row decoded to RGB (what tjbench times),
 *   entropy  jpeg_skip_scanlines over every row but the last: entropy decoding only, the coefficients discarded,
 *   strip    a 16-pixel-wide crop (jpeg_crop_scanline) of every row: entropy decoding inside
 *            jpeg_read_scanlines (coefficients stored, then discarded outside the crop), next to no IDCT,
 * alternated round by round. A crop window cannot skip the entropy decoding of the rows above its bottom edge or
 * of the columns beside it (docs/BENCHMARKS.md, "Prep micro-benchmarks"). Build and run with entropy_share.sh.
 */
#include "bench_files.h"
/* jpeglib.h needs FILE from stdio.h first */
#include <jpeglib.h>

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s 'GLOB' ROUNDS\n", argv[0]);
    return 2;
  }
  glob_t g;
  long *len;
  uint8_t **data = read_files(argv[1], &g, &len);
  int n = (int)g.gl_pathc, rounds = atoi(argv[2]);
  struct jpeg_decompress_struct ci;
  struct jpeg_error_mgr err;
  ci.err = jpeg_std_error(&err);
  jpeg_create_decompress(&ci);
  unsigned char *line = malloc(1 << 20);
  const char *names[] = {"full", "entropy", "strip"};
  double secs[3] = {0, 0, 0};
  for (int r = 0; r < rounds; r++) {
    for (int mode = 0; mode < 3; mode++) {
      double t0 = thread_cpu_seconds();
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
      secs[mode] += thread_cpu_seconds() - t0;
    }
  }
  for (int mode = 0; mode < 3; mode++) {
    printf("%-8s %7.1f images per CPU-second  (%.2f of full's time)\n", names[mode], n * (double)rounds / secs[mode],
           secs[mode] / secs[0]);
  }
  return 0;
}
