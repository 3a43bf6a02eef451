package io.unstall.flight.format;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Random;
import java.util.function.IntUnaryOperator;

/** Test data: an image-folder tree of random bytes ({@code root/class<c>/img<i>.jpg}). */
public final class ImageFolders {
  private ImageFolders() {}

  /**
   * Writes {@code classes x perClass} files, file {@code i} of each class {@code size(i)} bytes; returns their
   * contents in torchvision's sample order.
   */
  public static List<byte[]> write(Path root, int classes, int perClass, IntUnaryOperator size, long seed)
      throws IOException {
    Random rnd = new Random(seed);
    List<byte[]> out = new ArrayList<>();
    for (int c = 0; c < classes; c++) {
      for (int i = 0; i < perClass; i++) {
        byte[] b = new byte[size.applyAsInt(i)];
        rnd.nextBytes(b);
        Path p = root.resolve("class" + c + "/img" + i + ".jpg");
        Files.createDirectories(p.getParent());
        Files.write(p, b);
        out.add(b);
      }
    }
    return out;
  }
}
