package io.unstall.flight.format;

import io.unstall.flight.storage.Storage;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.List;
import java.util.function.LongConsumer;
import java.util.zip.CRC32C;

/**
 * TFRecord shards: each record is a sample. Record framing: u64 length, u32 masked CRC32C of the length,
 * data, u32 masked CRC32C of the data (all little-endian). Indexing reads only the 12-byte headers and checks
 * the length CRC; the data CRC is checked when a sample is read. A bad record is an error naming the file and
 * the record's byte offset.
 */
public final class TfRecordFormat implements Format {
  private static final int HEADER = 12;
  private static final int FOOTER = 4;
  private static final ThreadLocal<ByteBuffer> SMALL =
      ThreadLocal.withInitial(() -> ByteBuffer.allocate(HEADER).order(ByteOrder.LITTLE_ENDIAN));

  @Override
  public String name() {
    return "tfrecord";
  }

  @Override
  public SampleIndex index(Storage storage, LongConsumer progress) throws IOException {
    List<String> shards = storage.listObjects("").stream().filter(p -> !isHidden(p)).toList();
    if (shards.isEmpty()) {
      throw new java.io.FileNotFoundException("no TFRecord shards in " + storage.uri());
    }
    SampleIndex.Builder b = new SampleIndex.Builder(false);
    ByteBuffer header = ByteBuffer.allocate(HEADER).order(ByteOrder.LITTLE_ENDIAN);
    long done = 0;
    for (String shard : shards) {
      int fileNo = b.file(shard);
      long size = storage.pin(shard);
      long pos = 0;
      while (pos < size) {
        if (size - pos < HEADER + FOOTER) {
          throw corrupt(storage, shard, pos, "truncated record header (" + (size - pos) + " bytes left in file)");
        }
        header.clear();
        storage.readFully(shard, pos, header);
        long len = header.getLong(0);
        int lenCrc = header.getInt(8);
        int expect = mask(crc(header.array(), 0, 8));
        if (lenCrc != expect) {
          throw corrupt(storage, shard, pos, "length CRC32C mismatch");
        }
        if (len < 0 || len > size - pos - HEADER - FOOTER) {
          throw corrupt(storage, shard, pos, "record length " + len + " runs past the end of the file");
        }
        b.add(fileNo, pos + HEADER, len, -1);
        pos += HEADER + len + FOOTER;
      }
      progress.accept(++done);
    }
    return b.build();
  }

  @Override
  public String key(SampleIndex index, int id) {
    return index.file(id) + "@" + (index.offset(id) - HEADER);
  }

  @Override
  public int trailer() {
    return FOOTER; // the data's masked CRC32C
  }

  @Override
  public void extract(Storage storage, SampleIndex index, int id, ByteBuffer run, long runStart, ByteBuffer dst)
      throws IOException {
    int from = (int) (index.offset(id) - runStart);
    int len = index.length(id);
    int start = dst.position();
    dst.put(run.duplicate().position(from).limit(from + len));
    CRC32C c = new CRC32C();
    c.update(dst.duplicate().position(start).limit(start + len));
    if (run.order(ByteOrder.LITTLE_ENDIAN).getInt(from + len) != mask((int) c.getValue())) {
      throw corrupt(storage, index.file(id), index.offset(id) - HEADER, "data CRC32C mismatch");
    }
  }

  @Override
  public void read(Storage storage, SampleIndex index, int id, ByteBuffer dst) throws IOException {
    int start = dst.position();
    String shard = index.file(id);
    long dataOffset = index.offset(id);
    storage.readFully(shard, dataOffset, dst);
    ByteBuffer footer = SMALL.get();
    footer.clear().limit(FOOTER);
    storage.readFully(shard, dataOffset + index.length(id), footer);
    CRC32C c = new CRC32C();
    c.update(dst.duplicate().position(start).limit(start + index.length(id)));
    if (footer.getInt(0) != mask((int) c.getValue())) {
      throw corrupt(storage, shard, dataOffset - HEADER, "data CRC32C mismatch");
    }
  }

  /** TFRecord's masked CRC: rotate right by 15 and add a constant. */
  static int mask(int crc) {
    return ((crc >>> 15) | (crc << 17)) + 0xa282ead8;
  }

  static int crc(byte[] b, int off, int len) {
    CRC32C c = new CRC32C();
    c.update(b, off, len);
    return (int) c.getValue();
  }

  private static boolean isHidden(String path) {
    String name = path.substring(path.lastIndexOf('/') + 1);
    return name.startsWith(".") || name.startsWith("_");
  }

  private static CorruptRecordException corrupt(Storage storage, String shard, long offset, String what) {
    return new CorruptRecordException(storage.describe(shard), offset,
        "corrupt TFRecord record in '" + storage.describe(shard) + "' at byte offset " + offset + ": " + what);
  }
}
