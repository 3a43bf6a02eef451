package io.unstall.flight.prep;

import io.unstall.flight.prep.PrepPipeline.RandomResizedCrop;
import io.unstall.flight.prep.PrepPipeline.Resize;
import java.util.SplittableRandom;

/**
 * The sizes and crop boxes the spatial ops give, as torchvision computes them: shared by the OpenCV path, the
 * native path (which must draw the same random numbers in the same order) and the working-memory estimate.
 */
final class SpatialOps {
  private SpatialOps() {}

  /** The size a resize gives an h x w image (torchvision's rounding down for the longer side). */
  static long[] resizedSize(Resize r, long h, long w) {
    if (r.shorter() <= 0) {
      return new long[] {r.height(), r.width()};
    }
    return h <= w
        ? new long[] {r.shorter(), r.shorter() * w / h}
        : new long[] {r.shorter() * h / w, r.shorter()};
  }

  /** torchvision.transforms.RandomResizedCrop.get_params: returns {top, left, height, width}. */
  static int[] cropParams(int height, int width, RandomResizedCrop c, SplittableRandom rng) {
    double area = (double) height * width;
    double logMin = Math.log(c.ratioMin());
    double logMax = Math.log(c.ratioMax());
    for (int attempt = 0; attempt < 10; attempt++) {
      double target = area * uniform(rng, c.scaleMin(), c.scaleMax());
      double aspect = Math.exp(uniform(rng, logMin, logMax));
      int w = (int) Math.round(Math.sqrt(target * aspect));
      int h = (int) Math.round(Math.sqrt(target / aspect));
      if (w > 0 && w <= width && h > 0 && h <= height) {
        int top = rng.nextInt(height - h + 1);
        int left = rng.nextInt(width - w + 1);
        return new int[] {top, left, h, w};
      }
    }
    // Fallback: a central crop with the ratio clamped into range.
    double inRatio = (double) width / height;
    int w;
    int h;
    if (inRatio < c.ratioMin()) {
      w = width;
      h = (int) Math.round(w / c.ratioMin());
    } else if (inRatio > c.ratioMax()) {
      h = height;
      w = (int) Math.round(h * c.ratioMax());
    } else {
      w = width;
      h = height;
    }
    h = Math.max(1, Math.min(h, height));
    w = Math.max(1, Math.min(w, width));
    return new int[] {(height - h) / 2, (width - w) / 2, h, w};
  }

  private static double uniform(SplittableRandom rng, double lo, double hi) {
    return lo == hi ? lo : lo + (hi - lo) * rng.nextDouble();
  }
}
