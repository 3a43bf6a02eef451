package io.unstall.flight;

import io.unstall.flight.cache.CacheKey;
import io.unstall.flight.cache.SampleCache;
import io.unstall.flight.dataset.Dataset;
import io.unstall.flight.dataset.DatasetStats;
import io.unstall.flight.protocol.BatchSchema;
import io.unstall.flight.protocol.FetchTicket;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import org.apache.arrow.memory.ArrowBuf;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.vector.BigIntVector;
import org.apache.arrow.vector.BitVectorHelper;
import org.apache.arrow.vector.VarBinaryVector;
import org.apache.arrow.vector.VarCharVector;
import org.apache.arrow.vector.VectorSchemaRoot;

/**
 * Builds the record batch for a fetch ticket: each sample comes from the cache on a hit, or is read from
 * storage straight into the batch's payload buffer on a miss and then offered to the cache. The whole batch
 * is assembled before anything is sent, so a failure never yields a partial batch.
 */
public final class BatchAssembler {
  private final SampleCache cache;

  public BatchAssembler(SampleCache cache) {
    this.cache = cache;
  }

  /** Checks the ticket's ids against the dataset and returns them with the batch's payload size. */
  public static int[] checkedIds(Dataset d, FetchTicket t) {
    int[] ids = new int[t.size()];
    long bytes = 0;
    for (int i = 0; i < ids.length; i++) {
      ids[i] = d.checkId(t.id(i));
      bytes += d.length(ids[i]);
    }
    if (bytes > Integer.MAX_VALUE) {
      throw new IllegalArgumentException(
          "a batch of dataset '" + d.name() + "' would carry " + bytes + " payload bytes; Arrow binary columns"
              + " hold < 2 GiB: ask for fewer samples per ticket");
    }
    return ids;
  }

  public static long payloadBytes(Dataset d, int[] ids) {
    long bytes = 0;
    for (int id : ids) {
      bytes += d.length(id);
    }
    return bytes;
  }

  /** Assembles the batch; the caller owns (and closes) the returned root. */
  public VectorSchemaRoot assemble(Dataset d, long epoch, int[] ids, BufferAllocator allocator) throws IOException {
    int n = ids.length;
    VectorSchemaRoot root = VectorSchemaRoot.create(BatchSchema.SCHEMA, allocator);
    try {
      BigIntVector idVec = (BigIntVector) root.getVector(BatchSchema.ID);
      BigIntVector labelVec = (BigIntVector) root.getVector(BatchSchema.LABEL);
      VarCharVector keyVec = (VarCharVector) root.getVector(BatchSchema.KEY);
      VarBinaryVector payload = (VarBinaryVector) root.getVector(BatchSchema.PAYLOAD);
      idVec.allocateNew(n);
      labelVec.allocateNew(n);
      keyVec.allocateNew(n);
      payload.allocateNew(Math.max(1, payloadBytes(d, ids)), n);

      DatasetStats.Epoch stats = d.stats().epoch(epoch);
      ArrowBuf data = payload.getDataBuffer();
      ArrowBuf offsets = payload.getOffsetBuffer();
      ArrowBuf validity = payload.getValidityBuffer();
      int off = 0;
      for (int i = 0; i < n; i++) {
        int id = ids[i];
        int len = d.length(id);
        CacheKey key = new CacheKey(d.name(), id);
        if (cache.copyTo(key, data, off)) {
          stats.hit(len);
        } else {
          readFromStorage(d, id, data, off, len);
          stats.miss(len);
          cache.admit(key, data, off, len);
        }
        off += len;
        offsets.setInt((long) (i + 1) * Integer.BYTES, off);
        BitVectorHelper.setBit(validity, i);

        idVec.set(i, id);
        if (d.labelled()) {
          labelVec.set(i, d.label(id));
        } else {
          labelVec.setNull(i);
        }
        keyVec.setSafe(i, d.key(id).getBytes(StandardCharsets.UTF_8));
      }
      payload.setLastSet(n - 1);
      root.setRowCount(n);
      return root;
    } catch (IOException | RuntimeException e) {
      root.close();
      throw e;
    }
  }

  private static void readFromStorage(Dataset d, int id, ArrowBuf data, int off, int len) throws IOException {
    try {
      d.read(id, data.nioBuffer(off, len));
    } catch (java.nio.file.NoSuchFileException e) {
      throw new SampleNotFoundException(
          "dataset '" + d.name() + "' sample " + id + ": file '" + d.fileOf(id)
              + "' no longer exists (deleted after registration?)",
          e);
    }
  }

  /** A sample whose file disappeared after registration. */
  public static final class SampleNotFoundException extends IOException {
    SampleNotFoundException(String message, Throwable cause) {
      super(message, cause);
    }
  }
}
