import io.unstall.flight.prep.ImageHeader;
import java.nio.ByteBuffer;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;

/**
 * The sidecar's read of each JPEG header ({@code ImageHeader.read}: the structure rules over the whole file, what
 * {@code VouchedHeaders.packed} and {@code ImagePrep.check} run per sample), in microseconds per image, over files in
 * direct buffers as a slot's bytes are. Run by bench_mixed_backends.py beside the host's checks:
 *
 * <pre>java -cp sidecar/target/unstall-sidecar.jar benchmarks/HeaderRead.java ROUNDS FILE...</pre>
 *
 * Prints one line per round after two warm-up rounds: "round us_per_image".
 */
public final class HeaderRead {
  private HeaderRead() {}

  public static void main(String[] args) throws Exception {
    int rounds = Integer.parseInt(args[0]);
    List<ByteBuffer> files = new ArrayList<>();
    for (int i = 1; i < args.length; i++) {
      byte[] b = Files.readAllBytes(Path.of(args[i]));
      files.add(ByteBuffer.allocateDirect(b.length).put(b).flip());
    }
    int passes = Math.max(1, 20_000 / files.size()); // about 20,000 reads a round
    long sink = 0;
    for (int r = -2; r < rounds; r++) {
      long t0 = System.nanoTime();
      for (int p = 0; p < passes; p++) {
        for (ByteBuffer f : files) {
          sink += ImageHeader.read(f).width();
        }
      }
      double us = (System.nanoTime() - t0) / 1e3 / passes / files.size();
      if (r >= 0) {
        System.out.printf("%d %.2f%n", r, us);
      }
    }
    if (sink == 42) {
      System.out.println();
    }
  }
}
