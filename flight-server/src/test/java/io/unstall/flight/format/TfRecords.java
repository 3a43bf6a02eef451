package io.unstall.flight.format;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;

/** Writes TFRecord shards for tests, with correct masked CRC32Cs. */
public final class TfRecords {
  private TfRecords() {}

  /** Writes the records and returns each record's start offset. */
  public static long[] write(Path file, List<byte[]> records) throws IOException {
    ByteArrayOutputStream out = new ByteArrayOutputStream();
    long[] offsets = new long[records.size()];
    for (int i = 0; i < records.size(); i++) {
      byte[] data = records.get(i);
      offsets[i] = out.size();
      ByteBuffer h = ByteBuffer.allocate(12).order(ByteOrder.LITTLE_ENDIAN);
      h.putLong(0, data.length);
      h.putInt(8, TfRecordFormat.mask(TfRecordFormat.crc(h.array(), 0, 8)));
      out.write(h.array());
      out.write(data);
      ByteBuffer f = ByteBuffer.allocate(4).order(ByteOrder.LITTLE_ENDIAN);
      f.putInt(0, TfRecordFormat.mask(TfRecordFormat.crc(data, 0, data.length)));
      out.write(f.array());
    }
    Files.write(file, out.toByteArray());
    return offsets;
  }
}
