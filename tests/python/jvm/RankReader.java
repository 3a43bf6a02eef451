import java.io.FileInputStream;
import java.io.IOException;
import java.io.RandomAccessFile;

/**
 * One rank of a data-parallel job with a typical bug: every rank reads all of SHARED (64 KiB reads),
 * while SHARDED is read correctly, each rank only its own contiguous slice.
 * Arguments: SHARED SHARDED RANK WORLD_SIZE.
 */
public final class RankReader {
  public static void main(String[] args) throws IOException {
    int rank = Integer.parseInt(args[2]);
    int world = Integer.parseInt(args[3]);
    byte[] buf = new byte[64 << 10];
    long shared = 0;
    try (FileInputStream in = new FileInputStream(args[0])) {
      int n;
      while ((n = in.read(buf)) != -1) {
        shared += n;
      }
    }
    long sharded = 0;
    try (RandomAccessFile raf = new RandomAccessFile(args[1], "r")) {
      long len = raf.length();
      long from = len * rank / world;
      long to = len * (rank + 1) / world;
      raf.seek(from);
      while (from + sharded < to) {
        int n = raf.read(buf, 0, (int) Math.min(buf.length, to - from - sharded));
        if (n < 0) {
          break;
        }
        sharded += n;
      }
    }
    System.out.println("rank " + rank + " read " + shared + " + " + sharded);
  }
}
